"""The slow tier is declared on the tests, and stays so: a test that trains a zoo, runs a calibration study or uses
a slow fixture without saying so fails here, before it quietly lengthens `make test-fast`."""

from __future__ import annotations

from pathlib import Path

from tests.tier_support import RAY_CLUSTER_FIXTURES, SLOW_FIXTURES, fixtures_defined, undeclared_slow_tests


def test_every_test_that_trains_or_calibrates_declares_itself_slow() -> None:
    assert undeclared_slow_tests() == []


def test_every_slow_fixture_is_a_fixture_of_the_suite() -> None:
    """A renamed fixture left behind in SLOW_FIXTURES would silently move its users to the fast tier (and one left in
    RAY_CLUSTER_FIXTURES its tests out of their xdist group); a Ray cluster is slow."""
    assert SLOW_FIXTURES <= fixtures_defined()
    assert RAY_CLUSTER_FIXTURES <= SLOW_FIXTURES


def test_the_check_sees_a_trainer_through_helpers_fixtures_and_run_time_lookups(tmp_path: Path) -> None:
    """A made-up tests package: each undeclared way to reach a trainer, a KS test or a slow fixture is listed, and
    each declared one is not."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\nfrom scanner.zoo import build_zoo\n\n"
        "@pytest.fixture(scope='session')\ndef zoo():\n    return build_zoo('x')\n\n"
        "@pytest.fixture\ndef prints(zoo):\n    return zoo\n\n"
        "@pytest.fixture\ndef trained():\n    return build_zoo('y')\n")
    (tmp_path / "calibration_support.py").write_text(
        "from scipy import stats\n\ndef too_small(p):\n    return stats.kstest(p, 'uniform').pvalue\n")
    (tmp_path / "test_made_up.py").write_text(
        "import pytest\nfrom scanner.zoo import build_chain\nfrom tests.calibration_support import too_small\n\n"
        "def _chain(tmp):\n    return build_chain(tmp)\n\n"
        "def test_direct(tmp_path):\n    build_chain(tmp_path)\n\n"
        "def test_helper(tmp_path):\n    _chain(tmp_path)\n\n"
        "def test_other_module():\n    too_small([0.5])\n\n"
        "def test_fixture(trained):\n    pass\n\n"
        "def test_lookup(request):\n    request.getfixturevalue('zoo')\n\n"
        "def test_plain():\n    assert 1\n\n"
        "@pytest.mark.slow\ndef test_marked(tmp_path):\n    build_chain(tmp_path)\n\n"
        "def test_slow_fixture(prints):\n    too_small([0.5])\n\n"
        "class TestGroup:\n    def test_in_a_class(self, tmp_path):\n        _chain(tmp_path)\n")
    (tmp_path / "test_module_marked.py").write_text(
        "import pytest\nfrom scanner.zoo import build_zoo\n\npytestmark = [pytest.mark.slow]\n\n"
        "def test_trains(tmp_path):\n    build_zoo(tmp_path)\n")
    found = undeclared_slow_tests(tmp_path)
    assert found == [f"tests/test_made_up.py::{name}" for name in (
        "test_direct", "test_helper", "test_other_module", "test_fixture", "test_lookup", "TestGroup::test_in_a_class")]
