"""scripts/chapter_profile.py: where a chapter's time went, from its results file (#30)."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("chapter_profile", Path(__file__).parents[1] / "scripts" / "chapter_profile.py")
cp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cp)


def test_training_by_stage_and_each_suite_counted_once_per_condition():
    doc = {"results": {"runtime": [{"stage": "stage1", "seconds": 100}, {"stage": "stage2", "seconds": 50},
                                   {"stage": "stage2", "seconds": 30}],
                       "scores": [{"model": "m", "condition": "base", "suite": "instructions", "metric": "strict", "seconds": 40},
                                  {"model": "m", "condition": "base", "suite": "instructions", "metric": "lenient", "seconds": 40},
                                  {"model": "m", "condition": "vl", "suite": "instructions", "metric": "strict", "seconds": 20},
                                  {"model": "m", "condition": "vl", "suite": "knowledge", "metric": "acc", "seconds": 5}]}}
    p = cp.profile(doc)
    assert p == {"training: stage1": 100.0, "training: stage2": 80.0, "evaluation: instructions (generation)": 60.0,
                 "evaluation: knowledge (likelihood)": 5.0}
    t = cp.table(p, {k: 2 * v for k, v in p.items()})
    assert "before/after" in t and t.splitlines()[1].startswith("training: stage1") and "2.00" in t.splitlines()[-1]
