"""The one link check and the one file digest that discovery, validation, checkpoints and fingerprints share."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from scanner.files import PathRefused, file_sha256, resolve_inside


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "sub" / "weights.bin").write_bytes(b"w")
    (tmp_path / "elsewhere.bin").write_bytes(b"e")
    return Path(os.path.realpath(tmp_path / "root"))


def test_a_link_inside_the_root_resolves_to_its_target(root: Path) -> None:
    (root / "link").symlink_to(root / "sub" / "weights.bin")
    assert resolve_inside(root / "link", [root]) == root / "sub" / "weights.bin"
    assert resolve_inside(root, [root]) == root  # the root itself counts as inside


def test_a_link_out_of_the_root_is_refused_and_names_its_target(root: Path) -> None:
    (root / "out").symlink_to(root.parent / "elsewhere.bin")
    with pytest.raises(PathRefused) as refused:
        resolve_inside(root / "out", [root])
    assert refused.value.kind == "outside"
    assert refused.value.target == root.parent / "elsewhere.bin"
    # without roots only loops and unreadable paths are refused
    assert resolve_inside(root / "out") == root.parent / "elsewhere.bin"


def test_any_of_several_roots_will_do(root: Path) -> None:
    (root / "out").symlink_to(root.parent / "elsewhere.bin")
    assert resolve_inside(root / "out", [root / "sub", root.parent]) == root.parent / "elsewhere.bin"


def test_a_sibling_whose_name_extends_the_root_is_outside(root: Path) -> None:
    (root.parent / "root-other").mkdir()
    (root / "near").symlink_to(root.parent / "root-other")
    with pytest.raises(PathRefused, match="outside") as refused:
        resolve_inside(root / "near", [root])
    assert refused.value.kind == "outside"


def test_a_link_loop_is_refused_as_a_loop(root: Path) -> None:
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    with pytest.raises(PathRefused, match="symlink loop") as refused:
        resolve_inside(root / "a", [root])
    assert refused.value.kind == "loop"
    assert refused.value.error is not None


def test_a_dangling_link_is_unreadable_with_the_os_reason(root: Path) -> None:
    (root / "gone").symlink_to(root / "missing.bin")
    with pytest.raises(PathRefused) as refused:
        resolve_inside(root / "gone", [root])
    assert refused.value.kind == "unreadable"
    assert isinstance(refused.value.error, FileNotFoundError)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 10_000])
def test_file_sha256_is_the_digest_of_the_bytes_across_block_boundaries(tmp_path: Path, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    (tmp_path / "f").write_bytes(data)
    assert file_sha256(tmp_path / "f", block_bytes=4096) == hashlib.sha256(data).hexdigest()
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_file_sha256_of_a_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        file_sha256(tmp_path / "missing")
