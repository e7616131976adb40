"""Chapter 7's tiny LMs: corpus (determinism, disjoint held-out items, graders), tokenizer, the three
QK-norm variants (same modules, probe = eager, labels), training (loss falls, deterministic, cached)."""
import re

import pytest

from sinklib.errors import ParameterError
from sinklib.tiny import corpus
from sinklib.tiny.corpus import FormatItem
from sinklib.tiny.grading import grade

# ---------------------------------------------------------------------------------------
# corpus


def test_corpus_is_deterministic_and_seeded():
    a, b = corpus.make_corpus(300, seed=3), corpus.make_corpus(300, seed=3)
    assert a == b
    assert corpus.make_corpus(300, seed=4) != a
    assert corpus.make_corpus(100, seed=3) == a[:100]  # a larger corpus extends a smaller one
    kinds = {"format" if d.startswith("Q: ") else "prose" for d in a}
    assert kinds == {"format", "prose"}
    markers = {"answer_is": "Answer in the form", "upper": "in upper case:", "k_words": "Reply with exactly",
               "quoted": "in double quotes", "key_value": "key: value line", "repeat": "Repeat these words:",
               "story": " country ", "facts": None}
    found = {k: sum(m in d for d in a) for k, m in markers.items() if m}
    found["facts"] = sum(not d.startswith("Q: ") and " country " not in d for d in a)
    assert all(v > 0 for v in found.values()), found  # five graded tasks, the copying drill, stories, fact lists
    assert all(d.startswith("Q: ") for d in corpus.make_corpus(50, 0, format_share=1.0))
    assert not any(d.startswith("Q: ") for d in corpus.make_corpus(50, 0, format_share=0.0))
    assert corpus.eval_items("format", 20, 1) == corpus.eval_items("format", 20, 1)


@pytest.fixture(scope="module")
def train_docs():
    return corpus.make_corpus(6000, seed=0) + corpus.make_corpus(3000, seed=1)


def test_heldout_items_never_in_training(train_docs):
    joined = "\n".join(train_docs)
    fmt = corpus.eval_items("format", 100, seed=0)
    assert {it.task for it in fmt} == set(corpus.FORMAT_TASKS)
    assert all(corpus.split_of(it.key) == "eval" for it in fmt)
    assert len({it.key for it in fmt}) == len(fmt)
    for it in fmt:
        assert it.context() not in joined and it.document() not in joined
    # the content of a held-out item (numbers and words) is never the content of a training item
    train_prompts = {d.split("\nA: ")[0][3:] for d in train_docs if d.startswith("Q: ")}
    assert not train_prompts & {it.prompt for it in fmt}
    for kind in ("prose", "calibration"):
        texts = corpus.eval_items(kind, 60, seed=0)
        assert len(set(texts)) == 60
        assert not set(texts) & set(train_docs)
    assert not set(corpus.eval_items("prose", 60, 0)) & set(corpus.calibration_prompts(60, 0))
    # the knowledge questions' phrasing never occurs in training, the facts do
    for q in corpus.QUESTION_TEMPLATES.values():
        assert q.split("{E}")[0] not in joined
    for c in corpus.world():
        assert re.search(rf"\b{c.capital}\b", joined) and c.name in joined


def test_every_fact_is_stated_in_training(train_docs):
    text = "\n".join(d for d in train_docs if not d.startswith("Q: "))
    for c in corpus.world()[:10]:
        for attr, templates in corpus.FACT_TEMPLATES.items():
            stated = [t.format(E=c.name, V=c.value(attr)) for t in templates]
            assert any(s in text for s in stated), (c, attr)


def test_knowledge_items():
    items = corpus.eval_items("knowledge", 3 * corpus.N_COUNTRIES, seed=0)
    assert len({(i.country, i.attribute) for i in items}) == len(items)
    facts = {(c.name, a): c.value(a) for c in corpus.world() for a in corpus.ATTRIBUTES}
    for it in items:
        assert len(set(it.choices)) == 4 and it.choices[it.answer] == facts[(it.country, it.attribute)]
    with pytest.raises(ParameterError, match="'n'"):
        corpus.eval_items("knowledge", 3 * corpus.N_COUNTRIES + 1)


def _item(task, **info):
    return FormatItem(task, "prompt", "answer", "key", info)


@pytest.mark.parametrize("task, info, response, strict, lenient", [
    ("answer_is", {"number": 41}, "The answer is 41.", True, True),
    ("answer_is", {"number": 41}, " The answer is 41.  ", True, True),
    ("answer_is", {"number": 41}, "The answer is 41", False, True),
    ("answer_is", {"number": 41}, "It is 41.", False, True),
    ("answer_is", {"number": 41}, "The answer is 14.", False, False),
    ("answer_is", {"number": 41}, "41 or 14", False, False),  # lenient reads the last number
    ("upper", {"words": ["red", "fox"]}, "RED FOX", True, True),
    ("upper", {"words": ["red", "fox"]}, "red fox", False, True),
    ("upper", {"words": ["red", "fox"]}, "Red Fox.", False, True),
    ("upper", {"words": ["red", "fox"]}, "FOX RED", False, False),
    ("k_words", {"k": 3, "word": "owl"}, "owl owl owl", True, True),
    ("k_words", {"k": 3, "word": "owl"}, "owl owl", False, True),
    ("k_words", {"k": 3, "word": "owl"}, "owl, owl, owl", False, True),
    ("k_words", {"k": 3, "word": "owl"}, "Owl owl owl", False, True),
    ("k_words", {"k": 3, "word": "owl"}, "owl owl cat", False, False),
    ("k_words", {"k": 3, "word": "owl"}, "", False, False),
    ("quoted", {"target": "cat", "options": ["red", "cat", "cup"]}, '"cat"', True, True),
    ("quoted", {"target": "cat", "options": ["red", "cat", "cup"]}, "cat", False, True),
    ("quoted", {"target": "cat", "options": ["red", "cat", "cup"]}, "'cat'", False, True),
    ("quoted", {"target": "cat", "options": ["red", "cat", "cup"]}, '"cat" or "red"', False, False),
    ("key_value", {"key": "colour", "value": "red", "others": ["Mira", "cup"]}, "colour: red", True, True),
    ("key_value", {"key": "colour", "value": "red", "others": ["Mira", "cup"]}, "colour = red", False, True),
    ("key_value", {"key": "colour", "value": "red", "others": ["Mira", "cup"]}, "Colour: red", False, True),
    ("key_value", {"key": "colour", "value": "red", "others": ["Mira", "cup"]}, "Mira has a red cup", False, False),
    ("key_value", {"key": "owner", "value": "Mira", "others": ["red", "cup"]}, "owner: mira", False, True),
])
def test_graders(task, info, response, strict, lenient):
    assert grade(_item(task, **info), response) == {"strict": strict, "lenient": lenient}


def test_references_pass_strict_and_strict_implies_lenient():
    for it in corpus.eval_items("format", 100, seed=2):
        assert grade(it, it.answer) == {"strict": True, "lenient": True}
        assert grade(it, " " + it.answer) == {"strict": True, "lenient": True}  # the model's leading space
        for wrong in ("", "no", it.answer.lower(), it.answer + "!", it.answer.replace('"', "")):
            g = grade(it, wrong)
            assert g["lenient"] or not g["strict"]


def test_corpus_parameter_errors():
    with pytest.raises(ParameterError, match="'n_docs'"):
        corpus.make_corpus(0)
    with pytest.raises(ParameterError, match="'format_share'"):
        corpus.make_corpus(10, format_share=1.5)
    with pytest.raises(ParameterError, match="distinct 'k_words' items"):
        corpus.eval_items("k_words", 500)
    with pytest.raises(ParameterError, match="'kind'"):
        corpus.eval_items("poetry", 3)


# ---------------------------------------------------------------------------------------
# tokenizer


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


SMALL_TOK = {"vocab_size": 400, "n_docs": 1500}


def test_tokenizer_round_trip_bos_and_cache(tmp_cache):
    from sinklib.tiny import tokenizer as T

    tok = T.get_tokenizer(**SMALL_TOK)
    assert len(tok) == 400 and (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    texts = corpus.make_corpus(50, seed=9) + ["Scene: a red circle.\nQuestion: how many?\nAnswer: two",
                                              "café – ünïcode ✓ and   spaces\n"]
    for t in texts:
        ids = tok(t)["input_ids"]
        assert ids[0] == T.BOS_ID and T.BOS_ID not in ids[1:]
        assert tok.decode(ids, skip_special_tokens=True) == t
    nobos = T.get_tokenizer(add_bos=False, **SMALL_TOK)
    assert nobos(texts[0])["input_ids"] == tok(texts[0])["input_ids"][1:] == tok(texts[0], add_special_tokens=False)["input_ids"]
    assert T.tokenizer_dir(**SMALL_TOK).joinpath("tokenizer.json").exists()
    again = T.get_tokenizer(**SMALL_TOK)  # from the cache
    assert again.get_vocab() == tok.get_vocab()
    fresh = T.get_tokenizer(refresh=True, **SMALL_TOK)  # retrained: deterministic
    assert fresh.get_vocab() == tok.get_vocab()
    assert [fresh(t)["input_ids"] for t in texts] == [tok(t)["input_ids"] for t in texts]
    with pytest.raises(ParameterError, match="'vocab_size'"):
        T.get_tokenizer(vocab_size=10)


def test_chain_drill_follows_the_bigram_table_and_backcopies():
    docs = corpus.make_corpus(400, seed=2, chain_share=0.5)
    assert corpus.make_corpus(400, seed=2, chain_share=0.0) == corpus.make_corpus(400, seed=2)  # 0 = the old corpus
    chains = [d for d in docs if d.startswith("Chain: ")]
    assert 120 < len(chains) < 280
    succ = corpus.chain_successors()
    n_trig = 0
    for d in chains:
        w = d[len("Chain: "):].split()
        assert 30 <= len(w) <= 61
        for i in range(1, len(w)):
            if w[i - 1] == corpus.CHAIN_TRIGGER:
                assert w[i] == w[i - 2]  # back-copy: the word before the trigger
                n_trig += 1
            elif w[i] != corpus.CHAIN_TRIGGER:
                assert w[i] in succ[w[i - 1]]
    assert n_trig > 100
    with pytest.raises(ParameterError, match="chain_share"):
        corpus.make_corpus(10, 0, chain_share=1.5)


def test_pilot_sink_criterion():
    from sinklib.tiny.pilot import SINK_RISE, sink_formed

    assert sink_formed(-2.4, -2.4 + SINK_RISE) and not sink_formed(-2.4, -2.4 + SINK_RISE - 0.01)
    assert not sink_formed(-2.4, -3.0) and sink_formed(0.0, 1.0, rise=1.0)
