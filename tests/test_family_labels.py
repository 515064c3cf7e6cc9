"""The family page's box labels are fitted in one pass, whatever the length of an id (issue 34: a 100,000-character
id once held a server thread over ten minutes, its label re-measured from the start for every character cut).

No clock: the work is counted as the Python function calls that fitting a label makes, for a short id and one ten
times longer. And a real family with such an id is drawn on its page (a real database, the real app).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from jobs.web.app import create_app
from jobs.web.drawing import BOX_W, LABEL_PX, _label
from lineage_graph.persist import rebuild_lineage
from scanner.store import Store
from tests.store_support import Meta, record, test_row


def calls(work: Callable[[], object]) -> int:
    """Python and C function calls ``work()`` makes (sys.setprofile's call events)."""
    counted = 0

    def profile(frame, event, arg) -> None:  # noqa: ANN001 - the profiler's signature
        nonlocal counted
        counted += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return counted


def test_fitting_a_label_costs_the_same_for_an_id_ten_times_longer() -> None:
    short, long = "org/" + "w" * 300, "org/" + "w" * 3_000
    assert calls(lambda: _label(long, bold=True)) <= calls(lambda: _label(short, bold=True)) + 10
    organisation, name = _label(long, bold=False)
    assert organisation == "org/" and name.endswith("…") and 10 < len(name) < 40  # cut where the box ends
    assert name[:-1] == "w" * (len(name) - 1)


def test_the_family_page_draws_a_family_with_a_100000_character_id(tmp_path: Path) -> None:
    db, huge = tmp_path / "hub.duckdb", "org/" + "x" * 100_000
    with Store(db) as store:
        run = store.start_run({})
        for model in ("org/base", huge):
            store.upsert_model(record(model, bases=("org/base",) if model == huge else ()), Meta(), run, "ok")
        store.put_pair_tests([test_row("org/base", "r1", huge, "r1", -80.0, run)])
        store.finish_run(run, "succeeded", {})
        rebuild_lineage(store)
        family = store.query("SELECT family_id FROM families")["family_id"][0]
    page = create_app(db, host_names=None).test_client().get("/family", query_string={"id": family})
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    labels = [line for line in text.splitlines() if "xxxxxxxx" in line and "<text" in line]
    assert labels and all("…" in line and line.count("x") < BOX_W / (0.42 * LABEL_PX) + 40 for line in labels)
