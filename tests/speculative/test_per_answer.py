"""A request's own speculative setup on the drafters as loaded (no model): what a load
must have made, which drafters an answer gets, and what is refused."""
import pytest

from geniex.errors import UsageError
from geniex.speculative import per_answer
from geniex.speculative.drafters import ngram
from geniex.speculative.drafters.base import NO_DRAFTER, DrafterChain, ModelDrafter
from geniex.speculative.options import SpecOptions

pytestmark = pytest.mark.fast


class FakeDraftContextDrafter(ModelDrafter):
    """A model drafter's settings only (its contexts are what a load makes)."""

    name = "draft-simple"
    most = 64


def loaded_chain():
    return DrafterChain([ngram.make("ngram-mod", SpecOptions(types=("ngram-mod",))),
                         FakeDraftContextDrafter(3, 0, 0.0)])


def test_only_a_draft_model_is_part_of_what_a_load_makes():
    assert per_answer.load_key(SpecOptions()) == ()
    assert per_answer.load_key(SpecOptions(types=("ngram-mod",), ngram_max=4, n_max=7, policy="fixed")) == ()
    a = per_answer.load_key(SpecOptions(types=("draft-simple",), draft_model="x", draft_path="/m/x.gguf", n_max=2))
    b = per_answer.load_key(SpecOptions(types=("ngram-mod", "draft-simple"), draft_model="x",
                                        draft_path="/m/x.gguf", n_max=6))
    assert a == b != per_answer.load_key(SpecOptions(types=("draft-simple",), draft_path="/m/y.gguf"))


def test_an_answer_gets_the_loaded_parts_with_its_own_settings_and_the_next_gets_the_loaded_ones():
    loaded = loaded_chain()
    mod, model = loaded.drafters
    own = per_answer.drafter(loaded, SpecOptions(types=("ngram-mod", "draft-simple"), n_max=6, p_min=0.5,
                                                 ngram_max=5))
    assert own.drafters == [mod, model] and own.n_max == 6
    assert (model.n_max, model.p_min, mod.n_max) == (6, 0.5, 5)
    per_answer.restore(loaded)
    assert (model.n_max, model.p_min, mod.n_max) == (3, 0.0, 16)
    per_answer.restore(loaded)                      # (nothing to restore twice)
    assert (model.n_max, model.p_min, mod.n_max) == (3, 0.0, 16)


def test_other_ngram_methods_are_made_once_and_kept_and_no_setup_drafts_nothing():
    loaded, kept = loaded_chain(), {}
    first = per_answer.drafter(loaded, SpecOptions(types=("ngram-simple",)), kept=kept)
    again = per_answer.drafter(loaded, SpecOptions(types=("ngram-simple",), ngram_max=3), kept=kept)
    assert first is again and first.name == "ngram-simple" and again.n_max == 3
    longer = per_answer.drafter(loaded, SpecOptions(types=("ngram-mod",), ngram_n=6), kept=kept)
    assert longer is not loaded.drafters[0] and longer.n == 6        # another match length: another table
    assert per_answer.drafter(loaded, SpecOptions()) is NO_DRAFTER
    assert per_answer.drafter(loaded, SpecOptions(types=("bogus",))) is NO_DRAFTER


def test_what_the_loaded_contexts_cannot_hold_is_refused_naming_the_field():
    loaded = loaded_chain()
    with pytest.raises(UsageError, match="spec_n_max: .* at most 64"):
        per_answer.drafter(loaded, SpecOptions(types=("draft-simple",), n_max=65))
    with pytest.raises(UsageError, match="spec_ngram_max: .*recurrent.* 8 tokens"):
        per_answer.drafter(loaded, SpecOptions(types=("ngram-mod",), ngram_max=12), rollback=8)
    with pytest.raises(UsageError, match="spec_type: draft-simple"):
        per_answer.drafter(ngram.make("ngram-mod", SpecOptions(types=("ngram-mod",))),
                           SpecOptions(types=("draft-simple",)))
