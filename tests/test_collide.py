"""#29: the collision check by construction: a control's training pairs against the evaluation suites' strict
graders. It must flag the known collision (the text-only control's bare-number answers to "How many ...?" against
the math suite's strict "The answer is N."), and tell it apart from training data that keeps the format."""
import pytest

from sinklib.errors import ParameterError
from sinklib.evals import collide
from sinklib.vl import collisions


def test_templates():
    assert collide.template("How many shapes are there?") == "how many ...?"
    assert collide.template("Ana has 5 apples. Ana gets 2 more apples. How many apples does Ana have now?") == \
        "how many ...?"
    assert collide.template("Is there a red circle?") == collide.template("Is the sun a star?") == "is ...?"
    assert collide.template("What colour is the square?") == "what colour ...?"
    assert collide.template("Write a poem about rain. Use no commas.") == "write ..."
    with pytest.raises(ParameterError, match="empty"):
        collide.template("  ")


@pytest.fixture(scope="module")
def suites():
    return collide.local_suite_items()


def test_the_known_collision_is_flagged_for_every_current_control(suites):
    found = collisions.control_collisions(steps=5)
    for control, rows in found.items():
        math = [r for r in rows if r["suite"] == "math"]
        assert len(math) == 1 and math[0]["template"] == "how many ...?", control
        assert math[0]["verdict"] == "collision" and math[0]["rejected (%)"] == 100.0 and math[0]["eval items"] == 300
        assert rows[0]["verdict"] == "collision"  # collisions are listed first
        assert "how many ...? collides with 300 math items" in collide.sentence(rows)
    # the sentence-answer control keeps the collision: "There are 3 shapes." is not "The answer is 3."
    assert "There " in [r for r in found["text_only_sentence"] if r["suite"] == "math"][0]["train example"]


def test_training_that_keeps_the_strict_format_is_not_a_collision(suites):
    kept = [("How many shapes are there?", "There are 3 shapes. The answer is 3.")]
    rows = collide.find_collisions(kept, suites)
    math = [r for r in rows if r["suite"] == "math"][0]
    assert math["verdict"] == "shared template, format kept" and math["rejected (%)"] == 0.0
    knowledge = [r for r in rows if r["suite"] == "knowledge"][0]
    assert knowledge["verdict"] == "shared template, scored without a format" and knowledge["rejected (%)"] is None
    assert collide.sentence(rows) == "no training template collides with an evaluation item's strict format"


def test_unrelated_training_shares_nothing_and_empty_training_is_an_error(suites):
    assert collide.find_collisions([("Translate 'cat' into French.", "chat")], suites) == []
    with pytest.raises(ParameterError, match="no training examples"):
        collide.find_collisions([], suites)
    with pytest.raises(ParameterError, match="allowed: 'powered', 'core'"):
        collide.local_suite_items("all")
