import contextlib
import itertools
import json
import re

import numpy as np
import pytest
import torch
from _runs import make_cell, make_run
from hypothesis import given, settings
from hypothesis import strategies as st

from inactive_heads.report.compare import compare_runs, depth_w1_intervals, score_distances
from inactive_heads.report.crossings import crossing_ranks
from inactive_heads.report.document import render_table
from inactive_heads.report.writer import _pairwise_w1, write_report, write_study_report
from inactive_heads.runs.directory import RunDir, load_run
from inactive_heads.scores import SCORE_FUNCTIONS, HeadScores
from inactive_heads.stats.bootstrap import independent_counts
from inactive_heads.stats.crossing import Crossing
from inactive_heads.stats.curves import Curve, common_fraction_range, max_zeroed_within, normalized_auc

_TARGETS = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30)
# (knee, slope): accuracy stays at baseline until the knee, then falls linearly.
_SHAPES = {"ahon": (0.15, 1.0), "awft": (0.05, 2.0), "ahon_ln": (0.22, 0.5), "random": (0.0, 1.5)}


def _make_run(root, name, n_layers, n_heads, seed, baseline=0.62):
    g = torch.Generator().manual_seed(seed)
    scores = HeadScores({n: torch.rand(16, n_layers, n_heads, generator=g) + seed for n in _SHAPES}, {"rows": 16})
    shape = (n_layers, n_heads)
    cells = [make_cell(accuracy=baseline, acc_norm=baseline, mean_ll_correct=-1.0, n_items=50, shape=shape)]
    rng = np.random.default_rng(seed)
    for score, (knee, slope) in _SHAPES.items():
        for p in _TARGETS:
            frac = 0.0 if p == 0 else float(p + rng.uniform(-0.01, 0.01))
            acc = baseline - slope * max(0.0, frac - knee) + float(rng.uniform(-0.002, 0.002))
            per_head = (torch.rand(n_layers, n_heads, generator=g) * 2 * frac).clamp(0, 1).tolist()
            cells.append(
                make_cell(
                    score, p, threshold=0.1 * p, accuracy=acc, acc_norm=acc, mean_ll_correct=-1.0 - frac,
                    fraction_zeroed=frac, shape=shape, per_head=per_head, n_items=50, seconds=2.0,
                )
            )  # fmt: skip
    return make_run(
        root / name,
        cells,
        name=name,
        shape=shape,
        evaluation={"shots": 0, "limit": 50, "seed": seed},
        scores=scores,
        meta={"task": "piqa", "rows": 16},
    )


def _expected_table2(run_dir):
    # Recompute from the raw cell files, independently of RunData.
    cells = []
    for p in (run_dir / "cells").glob("*.json"):
        with contextlib.suppress(ValueError):
            cells.append(json.loads(p.read_text()))
    baseline = next(c["accuracy"] for c in cells if c["score"] is None)
    curves = {s: sorted((c["fraction_zeroed"], c["accuracy"]) for c in cells if c["score"] == s) for s in _SHAPES}
    hi = common_fraction_range([Curve(s, pts, baseline) for s, pts in curves.items()])
    return {
        s: (f"{100 * max_zeroed_within(pts, baseline, 0.01):.1f}", f"{normalized_auc(pts, baseline, hi):.3f}")
        for s, pts in curves.items()
    }


def _w1_by_quantiles(a, b) -> float:
    """W1 as the integral of |Q_a(u) - Q_b(u)| over u in (0, 1): both quantile functions are steps at i / n."""
    a, b = np.sort(np.ravel(a).astype(np.float64)), np.sort(np.ravel(b).astype(np.float64))
    u = np.union1d(np.arange(a.size + 1) / a.size, np.arange(b.size + 1) / b.size)
    mid = (u[1:] + u[:-1]) / 2  # Q is constant on each interval between breakpoints; read it at the midpoint
    return float(np.sum(np.abs(a[(mid * a.size).astype(int)] - b[(mid * b.size).astype(int)]) * np.diff(u)))


def _depth_bins(n_layers: int, n_bins: int) -> list[list[int]]:
    # Layer l of L covers relative depths [l / L, (l + 1) / L); it belongs to the bin holding its midpoint.
    return [[layer for layer in range(n_layers) if int((layer + 0.5) * n_bins / n_layers) == b] for b in range(n_bins)]


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}")[1].split("\n## ")[0]


def _score_rows(text: str, n_cells: int) -> dict[str, list[str]]:
    """The cells of every ``n_cells``-column Markdown table row whose first cell is a score of the fixture."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == n_cells and cells[0] in _SHAPES:
            rows[cells[0]] = cells
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return [_make_run(root, "tiny-a", 4, 6, seed=0), _make_run(root, "tiny-b", 6, 4, seed=1, baseline=0.70)]


def test_load_run_reads_cells_scores_and_calibration(runs):
    run = load_run(runs[0])
    assert run.name == "tiny-a" and run.baseline == pytest.approx(0.62)
    assert len(run.cells) == 1 + len(_SHAPES) * len(_TARGETS)
    assert run.scores is not None and run.scores.shape == (16, 4, 6)
    assert set(run.curves()) == set(_SHAPES)
    assert run.calibration_meta == {"task": "piqa", "rows": 16}


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    return write_report(runs, tmp_path_factory.mktemp("report"))


@pytest.fixture
def damaged(tmp_path):
    """A run whose cells include one with a wrong-typed field and one truncated file, beside three valid cells."""
    cells = [make_cell(accuracy=0.6), make_cell("ahon", 0.1, accuracy=0.6, fraction_zeroed=0.1)]
    cells.append(make_cell("ahon", 0.2, accuracy=0.5, fraction_zeroed=0.2))
    run_dir = make_run(tmp_path / "run", cells)
    valid = json.loads(next((run_dir / "cells").glob("*.json")).read_text())
    (run_dir / "cells" / "high.json").write_text(json.dumps({**valid, "accuracy": "high"}))
    (run_dir / "cells" / "torn.json").write_text(json.dumps(valid)[:40])
    return run_dir


def _warned_once_each(record) -> None:
    messages = [str(w.message) for w in record]
    assert len(messages) == 2, messages
    high = next(m for m in messages if "high.json" in m)
    assert "wrong type ['accuracy']" in high
    assert any("torn.json" in m and "unreadable" in m for m in messages)


def test_load_run_skips_malformed_and_truncated_cells_naming_each_file(damaged):
    with pytest.warns(UserWarning) as record:
        run = load_run(damaged)
    _warned_once_each(record)
    assert len(run.cells) == 3 and run.baseline == 0.6


def test_report_is_written_over_malformed_and_truncated_cells(damaged, tmp_path):
    import csv

    with pytest.warns(UserWarning) as record:
        write_report([damaged], tmp_path / "report")
    _warned_once_each(record)
    with (tmp_path / "report" / "cells.csv").open(newline="") as f:
        assert [r["score"] for r in csv.DictReader(f)] == ["baseline", "ahon", "ahon"]
    # the study's report reads the cells of its planned keys, the damaged ones among them
    keys = [*RunDir(damaged).cell_store().keys(), "high", "torn"]
    with pytest.warns(UserWarning) as record:
        write_study_report([(damaged, keys)], tmp_path / "study-report", n_resamples=10)
    _warned_once_each(record)
    assert "3 cells" in (tmp_path / "study-report" / "report.md").read_text()


def test_report_table2_matches_analysis_of_stored_cells(runs, report):
    md = report[0].read_text(encoding="utf-8")
    for run_dir, title in zip(runs, ["tiny-a — piqa", "tiny-b — piqa"], strict=True):
        rows = _score_rows(_section(md, title), 5)
        expected = _expected_table2(run_dir)
        assert set(rows) == set(_SHAPES)
        for score, (max_pct, auc) in expected.items():
            assert rows[score][2] == max_pct, score
            assert rows[score][3] == auc, score
        # Ranks follow max % zeroed: ahon_ln (knee 0.22) beats ahon (0.15) beats awft (0.05) and random (0.0).
        order = sorted(rows, key=lambda s: float(rows[s][4]))
        assert order[:2] == ["ahon_ln", "ahon"]
        assert rows["ahon"][1] == SCORE_FUNCTIONS["ahon"].label


def test_cells_csv_has_every_stored_cell(runs, report):
    import csv

    with (report[0].parent / "cells.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    for run_dir in runs:
        run = load_run(run_dir)
        rows = [r for r in table if r["model"] == run.name]
        assert len(rows) == len(run.cells) == 1 + len(_SHAPES) * len(_TARGETS)
        assert rows[0]["score"] == "baseline" and rows[0]["target"] == "" and float(rows[0]["delta"]) == 0
        stored = {(c.score or "baseline", c.target): c for c in run.cells}
        for r in rows:
            cell = stored[r["score"], None if r["target"] == "" else float(r["target"])]
            assert float(r["accuracy"]) == pytest.approx(cell.accuracy, rel=1e-5)
            assert float(r["fraction_zeroed"]) == pytest.approx(cell.fraction_zeroed, rel=1e-5, abs=1e-9)
            assert float(r["delta"]) == pytest.approx(cell.accuracy - run.baseline, abs=1e-6)
            assert r["task"] == "piqa" and r["n_items"] == "50" and r["delta_low"] == r["delta_high"] == ""
            assert r["calibration"] == "calibrated on the evaluated items"


def test_report_wasserstein_section_is_w1_of_pooled_calibration_scores(runs, report):
    md = report[0].read_text(encoding="utf-8")
    section = _section(md, "Wasserstein-1 distance between score distributions")
    assert "| score | tiny-a vs tiny-b |" in section
    a, b = (load_run(r).scores for r in runs)
    rows = _score_rows(section, 2)
    assert set(rows) == set(_SHAPES)
    for score, (_, w1) in rows.items():
        assert float(w1) == pytest.approx(_w1_by_quantiles(a[score], b[score]), rel=1e-3), score


def test_wasserstein_section_needs_two_runs(runs):
    assert _pairwise_w1([load_run(runs[0])]) is None
    assert _pairwise_w1([load_run(r) for r in runs]) is not None


def test_report_files_and_self_contained_html(report):
    md_path, html_path = report
    md = md_path.read_text(encoding="utf-8")
    page = html_path.read_text(encoding="utf-8")
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(linked) == 6  # 2 x (curves, head heatmap), rank heatmap, CDFs
    for name in linked:
        assert (md_path.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page, flags=re.I)
    assert len(refs) == len(linked) and all(r.startswith("data:image/png;base64,") for r in refs)
    assert "<link" not in page and "http://" not in page and "https://" not in page and "url(" not in page
    assert "<table>" in page and "ahon" in page


def test_compare_runs_across_layer_counts(runs, tmp_path):
    """4 vs 6 layers: pooled W1, and W1 per relative-depth bin (4 bins: 1 layer of tiny-a, 1-2 of tiny-b each)."""
    text, fig = compare_runs(runs[0], runs[1], out_dir=tmp_path)
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    a, b = load_run(runs[0]).scores, load_run(runs[1]).scores
    assert (a.shape[1], b.shape[1]) == (4, 6)
    bins_a, bins_b = _depth_bins(4, 4), _depth_bins(6, 4)
    assert bins_a == [[0], [1], [2], [3]] and bins_b == [[0], [1, 2], [3], [4, 5]]
    rows = _score_rows(text, 4)
    assert set(rows) == set(_SHAPES)
    for score, cells in rows.items():
        pooled, per_mean, per_max = (float(c.split(" ")[0]) for c in cells[1:])
        per = [_w1_by_quantiles(a[score][:, ia], b[score][:, ib]) for ia, ib in zip(bins_a, bins_b, strict=True)]
        assert pooled == pytest.approx(_w1_by_quantiles(a[score], b[score]), rel=1e-3), score
        assert per_mean == pytest.approx(np.mean(per), rel=1e-3), score
        assert per_max == pytest.approx(np.max(per), rel=1e-3), score


def test_depth_w1_intervals_are_a_loop_over_resampled_items(runs, tmp_path):
    """Per relative-depth bin, the interval is the percentile range of W1 between explicitly repeated items."""
    a, b = load_run(runs[0]), load_run(runs[1])
    assert depth_w1_intervals(a, b, "ahon") is None  # no row items recorded: no intervals
    items_a, items_b = np.arange(16) // 2, np.arange(16) // 4  # 8 items of 2 rows, 4 items of 4 rows
    for run, items in ((a, items_a), (b, items_b)):
        run.calibration_meta["row_items"] = items.tolist()
    r, seed = 120, 3
    got = depth_w1_intervals(a, b, "ahon", n_resamples=r, seed=seed)
    counts_a, counts_b = independent_counts([8, 4], r, seed)  # calibrated on different items: unpaired
    sa, sb = a.scores["ahon"].numpy(), b.scores["ahon"].numpy()
    assert got is not None and len(got) == 4
    for iv, la, lb in zip(got, _depth_bins(4, 4), _depth_bins(6, 4), strict=True):
        assert iv.value == pytest.approx(_w1_by_quantiles(sa[:, la], sb[:, lb]), rel=1e-9)
        loop = []
        for ca, cb in zip(counts_a, counts_b, strict=True):
            rep_a = np.concatenate([sa[items_a == i][:, la].ravel() for i in np.repeat(np.arange(8), ca)])
            rep_b = np.concatenate([sb[items_b == i][:, lb].ravel() for i in np.repeat(np.arange(4), cb)])
            loop.append(_w1_by_quantiles(rep_a, rep_b))
        assert (iv.low, iv.high) == pytest.approx(tuple(np.percentile(loop, [2.5, 97.5])), rel=1e-9)
    header, rows, _ = score_distances(a, b, ["ahon"], n_resamples=r, seed=seed)
    assert header[-1] == "W1 per depth (max) [95% CI]"
    top = max(got, key=lambda iv: iv.value)
    assert rows[0][3] == f"{top.value:.4g} [{top.low:.4g}, {top.high:.4g}]"


def test_png_is_a_deterministic_palette_image_of_the_render():
    import io

    from PIL import Image

    from inactive_heads.report.figures import figure, png

    fig = figure(3, 2)
    ax = fig.add_subplot()
    x = np.linspace(0, 1, 50)
    for k in range(12):
        ax.plot(x, x**k, label=str(k))
    ax.imshow(np.random.default_rng(0).random((8, 8)), cmap="Blues", extent=(0, 1, 0, 1))
    data = png(fig)
    assert data == png(fig)
    small = Image.open(io.BytesIO(data))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    full = np.asarray(Image.open(buf).convert("RGB"), dtype=np.float64)
    assert small.mode == "P" and small.size == (full.shape[1], full.shape[0])
    assert np.abs(np.asarray(small.convert("RGB"), dtype=np.float64) - full).mean() < 1.0


def test_render_table_formats():
    header, rows = ["score", "a|b", "n"], [["ahon", "x<y", "1.5"], ["random", "", "12.25"]]
    assert render_table(header, rows) == (
        "| score | a\\|b | n |\n|---|---|---|\n| ahon | x&lt;y | 1.5 |\n| random |  | 12.25 |"
    )
    assert render_table(header, rows, fmt="html") == (
        "<table><thead><tr><th>score</th><th>a|b</th><th>n</th></tr></thead><tbody>"
        "<tr><td>ahon</td><td>x&lt;y</td><td>1.5</td></tr><tr><td>random</td><td></td><td>12.25</td></tr>"
        "</tbody></table>"
    )
    assert render_table(header, rows, fmt="text", align="llr").splitlines() == [
        "score   a|b      n",
        "ahon    x<y    1.5",
        "random       12.25",
    ]
    assert render_table(header, [], fmt="text") == "score  a|b  n"
    with pytest.raises(ValueError, match="align"):
        render_table(header, rows, fmt="text", align="lr")
    with pytest.raises(ValueError, match="format"):
        render_table(header, rows, fmt="latex")  # type: ignore[arg-type]


def test_markdown_escapes_raw_html_from_names():
    from inactive_heads.report.document import Document

    doc = Document()
    doc.h(2, "<img src=x onerror=alert(1)> — piqa")
    doc.p("model <script>x</script> & co")
    md = doc.markdown()
    assert "<img" not in md and "<script>" not in md
    assert "&lt;img src=x onerror=alert(1)&gt;" in md and "&amp; co" in md


def _possible_ranks(values: list[tuple[int, bool]]) -> list[tuple[int, int]]:
    """Brute force: the best and worst rank of each (value, censored) over every completion of the censored values
    (any value above the bound, half-points included, so every order and tie with the others occurs) and every
    order of ties."""
    top = max(v for v, _ in values) + 1
    choices = [[v] if not cens else [c / 2 for c in range(2 * v + 1, 2 * top + 1)] for v, cens in values]
    best, worst = [len(values)] * len(values), [1] * len(values)
    for true in itertools.product(*choices):
        for i, v in enumerate(true):
            best[i] = min(best[i], 1 + sum(o > v for o in true))
            worst[i] = max(worst[i], len(true) - sum(o < v for o in true))
    return list(zip(best, worst, strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=5), st.booleans())
def test_crossing_ranks_are_every_rank_the_censored_crossings_allow(values, with_na):
    crossings = {
        f"f{i}": Crossing("censored" if cens else "estimated", v / 10, 0.0, v / 10, cens, 0.95, 0.01)
        for i, (v, cens) in enumerate(values)
    }
    if with_na:
        nan = float("nan")
        crossings["none"] = Crossing("not_applicable", nan, nan, nan, False, 0.95, 0.01)
    ranks = crossing_ranks(crossings)
    assert "none" not in ranks  # n/a is never ranked
    expected = [str(b) if b == w else f"{b}–{w}" for b, w in _possible_ranks(values)]
    assert [ranks[f"f{i}"] for i in range(len(values))] == expected
