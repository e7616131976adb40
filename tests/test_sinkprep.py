"""Chapter 9's parallel cache filling (sinklib.tiny.sinkprep): it plans exactly the models the chapter computes,
and what a worker process computes is what the chapter reads back, number for number."""
import pytest

from sinklib.tiny import backcopy_adapt as ba
from sinklib.tiny import backcopy_train as bt
from sinklib.tiny import sinkpanel as sp
from sinklib.tiny import sinkprep

TINY = {"pilot_steps": 3, "panel_steps": 3, "check_every": 2, "batch": 4, "eval_n": 4, "stage1_steps": 2,
        "stage2_steps": 2, "vqa_n": 12, "n_perm": 9, "n_boot": 9}


@pytest.fixture()
def cache_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


def test_chapter_params_are_the_notebook_defaults_under_the_profile():
    full, quick = sinkprep.chapter_params("full"), sinkprep.chapter_params("quick")
    assert full["profile"] == "full" and quick["profile"] == "quick"
    assert quick["pilot_steps"] < full["pilot_steps"]
    assert set(full) == set(sp.CHAPTER9_PARAMS)


def test_chapter_params_refuse_an_unknown_profile():
    with pytest.raises(Exception, match="nosuch"):
        sinkprep.chapter_params("nosuch")


def test_the_plan_covers_every_model_of_the_chapter_once():
    p = sinkprep.chapter_params("full")
    jobs = sinkprep.plan(p)
    keys = [str(bt._key(j["params"])) for j in jobs]
    assert len(keys) == len(set(keys))                                     # one job per trained model
    common = {"batch": p["batch"], "eval_n": p["eval_n"], "check_every": p["check_every"]}
    grid = sp.model_grid(p["variants"], p["settings"], p["seeds"], {**common, "steps": p["panel_steps"]},
                         p["replicate_settings"])
    panel = {str(bt._key(g["params"])) for g in grid}
    assert len(grid) >= 18 and len(panel) == len(grid)                    # #28: at least 18 distinct base models
    assert panel <= set(keys)
    assert all(j["causal"] and j["adapts"] for j in jobs if str(bt._key(j["params"])) in panel)
    steps = [j["params"]["steps"] for j in jobs]
    assert steps == sorted(steps, reverse=True)                            # longest first
    recipe = [j for j in jobs if "recipe tries" in j["labels"]]
    assert len(recipe) == 1 and {**recipe[0]["adapts"][1], **ba.FIRST_TRY} == recipe[0]["adapts"][0]


def test_a_workers_results_are_what_the_chapter_reads(cache_tmp, monkeypatch):
    p = {**sinkprep.chapter_params("quick"), **TINY, "pilot_tries": ["base"], "variants": ["none", "per_head"],
         "settings": ["base"], "seeds": [0]}
    done = sinkprep.prepare(p, jobs=2, log=lambda s: None)                 # two spawned worker processes
    assert len(done) == 2
    common = {"batch": p["batch"], "eval_n": p["eval_n"], "check_every": p["check_every"]}
    grid = sp.model_grid(p["variants"], p["settings"], p["seeds"], {**common, "steps": p["panel_steps"]})
    adapt = {k: p[k] for k in ("stage1_steps", "stage2_steps", "lr_lm", "vqa_n")}
    cached_base, cached_adapt = sp.base_table(grid), sp.adapt_table(grid, adapt)

    def refuse(*a, **k):
        raise AssertionError("the chapter recomputed what the workers cached")

    monkeypatch.setattr(bt, "_fit", refuse)
    monkeypatch.setattr(ba, "_conditions", refuse)
    sp.base_table(grid), sp.adapt_table(grid, adapt), sp.causal_table(grid)    # all from the cache
    monkeypatch.undo()
    monkeypatch.setenv("SINKBOOK_CACHE", str(cache_tmp / "here"))
    sp.torch_threads(1)
    here_base, here_adapt = sp.base_table(grid), sp.adapt_table(grid, adapt)   # recomputed in this process
    cols = ["S", "sink03", "rule_acc", "know_acc", "know_ppl"]
    assert cached_base[cols].equals(here_base[cols]), _largest_gaps(cached_base, here_base, cols)
    cols = cols + ["task_acc"]
    assert cached_adapt[cols].equals(here_adapt[cols]), _largest_gaps(cached_adapt, here_adapt, cols)


def _largest_gaps(a, b, cols) -> str:
    """What a failed exact comparison says: each column's largest |worker - here| and its dtypes (it failed once,
    beside a long job, and passed alone: DEVELOPING, session 61)."""
    gaps = {c: (float((a[c].astype(float) - b[c].astype(float)).abs().max()), str(a[c].dtype), str(b[c].dtype))
            for c in cols}
    return f"worker vs in-process rows differ; largest gap per column (gap, dtypes): {gaps}; index equal: " \
           f"{a.index.equals(b.index)}"


def test_main_dry_run_lists_the_jobs(capsys):
    assert sinkprep.main(["--profile", "quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "none|base|s0" in out and "causal" in out
