"""The engine's local shortcuts against the token-by-token reference.

Locally a row runs on its carrier (the model that supplies most of its work, the others'
modules grafted at the remaining cells), rows of one prompt that graft the same cells before
its last token (nothing, or e.g. FE for FE and FE+LT) share that prefix through a key/value
cache, and grafted matrix products run their own
weights only on the cells no donor takes. Each test checks the numbers against the
independent reference (<= 1e-5 in float32, <= 1e-10 in float64) AND that the shortcut it is
about was taken, so a shortcut that stops being exact, or stops being used, fails here.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import graft.core.execution.executor as executor
import graft.core.execution.routing as routing
import graft.core.execution.split as split_module
from graft.core.execution.engine import GraftRow, LocalExecutor, run_grafts
from graft.core.families.arch import architecture_of
from graft.core.language.spec import parse_spec
from graft.core.planning.carrier import BASE, is_empty
from graft.core.planning.kv_cache import CACHE_ARGUMENTS
from graft.core.planning.plan import resolve_rows
from graft.errors import SlowPathWarning
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.fast_tier import slow_except
from tests.reference import reference_last_logits

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
#: Prompt-major rows: every spec on every prompt, as experiments build them.
SPECS = [
    "none",
    "ALL:all:all; head=donor",  # the donor's plain forward
    "FE:all:all",
    "LT:all:all",  # last token only: a shared prefix on the base
    "FE+LT:all:all",
    "(FE+LT)^C:all:all",  # carried by the donor, the base's modules at FE and LT
    "FE^C:all:all",
    "LT^C:all:all",  # carried by the donor, on a shared prefix of the donor
    "ALL:all:all",  # the donor's forward read out through the base's head
    "LT:q4:o,ffn",
    "LT:all:attn",
    "LT:h2:o,ffn_up; head=donor",
    "LT:all:all; head=paper",
    "LT:all:o@task; LT:q4:ffn",  # two donors on one step
    "ALL:all:all@task; LT:all:o",  # carried by 'task', 'sft' and the base grafted into it
    "FE^C:all:all; LT:all:ffn@task",  # shares FE^C's prefix on 'sft'
    "(FE+LT)^C:all:all@task",  # the only row of its prefix on 'task': a whole prompt there
]
LENGTHS = (6, 9, 11, 2)  # a two-token prompt has a one-token prefix
# the reference checks of one family are in the fast tier, the other families are slow
CASES = slow_except([(f, None) for f in TINY_FAMILIES] + [("llama", True)], ("llama", None))


def prompt_rows(specs=SPECS, lengths=LENGTHS, seed=0) -> list[GraftRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = [1] + torch.randint(3, 96, (n - 1,), generator=g).tolist()
        spans = {"FE": [1, 2] if n > 3 else [1]}
        rows += [GraftRow(ids, spans, parse_spec(s)) for s in specs]
    return rows


def entity_rows(specs, prompts) -> list[GraftRow]:
    """Every spec on prompts given as (length, first-entity positions), ids seeded by length."""
    rows = []
    for n, fe in prompts:
        g = torch.Generator().manual_seed(n)
        ids = [1] + torch.randint(3, 96, (n - 1,), generator=g).tolist()
        rows += [GraftRow(ids, {"FE": fe}, parse_spec(s)) for s in specs]
    return rows


def reference(base, donors, arch, rows) -> torch.Tensor:
    out = []
    for row in rows:
        res = row.spec.resolve(arch, len(row.input_ids), dict(row.spans))
        out.append(
            reference_last_logits(
                base,
                donors,
                list(row.input_ids),
                res.cells,
                res.final_norm_donor,
                res.unembed_donor,
            )
        )
    return torch.stack(out)


@pytest.fixture(scope="module")
def setup():
    cache = {}

    def get(family, tied=None, dtype=torch.float32):
        key = (family, tied, dtype)
        if key not in cache:
            base = tiny_model(family, seed=0, tied=tied).to(dtype)
            donors = {"sft": perturbed_copy(base, seed=1), "task": perturbed_copy(base, seed=2)}
            arch = architecture_of(base)
            rows = prompt_rows()
            cache[key] = (base, donors, arch, rows, reference(base, donors, arch, rows))
        return cache[key]

    return get


class Spy(LocalExecutor):
    """A local executor that notes which model ran each plan and how."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = []  # plans: (on a donor, a step on shared prefixes, grafted)
        self.prefixes = []  # prefix forwards: (on a donor, "plain" or "grafted")
        self.moved_steps = []  # steps run on another model than their prefixes: on a donor

    def run_plan(self, base, donors, plan):
        runner = base if plan.step_model is None else donors[plan.step_model]
        on_donor = BASE in donors and runner is not donors[BASE]
        self.seen.append((on_donor, plan.prefix is not None, bool(plan.patches)))
        if plan.step_model is not None:
            self.moved_steps.append(on_donor)
        return super().run_plan(base, donors, plan)

    def _one_cache(self, base, donors, prefix, device):
        on_donor = BASE in donors and base is not donors[BASE]
        self.prefixes.append((on_donor, "grafted" if prefix.patches else "plain"))
        return super()._one_cache(base, donors, prefix, device)


def _off(out, refs, rows) -> dict:
    diffs = (out - refs).abs().amax(dim=-1)
    return {
        f"{r.spec} ({len(r.input_ids)} tokens)": float(d)
        for r, d in zip(rows, diffs, strict=True)
        if d > TOL
    }


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize(("family", "tied"), CASES)
def test_every_local_path_matches_the_reference(setup, family, tied, padding_side, monkeypatch):
    base, donors, _, rows, refs = setup(family, tied)
    monkeypatch.setattr(split_module, "SPLIT_MIN_FEATURES", 0)  # tiny models: split them too
    splits = []
    original = executor.split_modules

    def spy_split(torch_model, batch, table=None):
        found = original(torch_model, batch, table)
        splits.append(len(found))
        return found

    monkeypatch.setattr(executor, "split_modules", spy_split)
    spy = Spy()
    out = run_grafts(base, donors, rows, batch_size=5, padding_side=padding_side, executor=spy)
    assert not _off(out, refs, rows), f"{family}: rows off the reference: {_off(out, refs, rows)}"
    # every shortcut was taken: steps on shared prefixes, plain and grafted, of the base and
    # of a donor; whole prompts carried by a donor; split matrix products
    kinds = set(spy.seen)
    assert {(False, True, True), (True, True, True), (True, False, True)} <= kinds
    assert set(spy.prefixes) == {(d, k) for d in (False, True) for k in ("plain", "grafted")}
    # steps whose last token another model computes ran there: a donor on the base's
    # prefixes (LT) and the base on a donor's (LT^C)
    assert set(spy.moved_steps) == {False, True}
    assert any(splits)
    # and the reference is not trivially met: on every prompt every graft moves the logits
    per_prompt = refs.view(len(LENGTHS), len(SPECS), -1)
    moved = (per_prompt[:, 1:] - per_prompt[:, :1]).abs().amax(dim=-1)
    assert float(moved.min()) > 1e-4


# not gemma2: its eager attention returns NaN in float64 for a left-padded batch whose padding
# fills a sliding window, in transformers itself
@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "gemma3"])
def test_every_local_path_matches_the_reference_in_float64(setup, family):
    base, donors, _, rows, refs = setup(family, dtype=torch.float64)
    out = run_grafts(base, donors, rows, batch_size=7)
    assert out.dtype == torch.float64
    assert (out - refs).abs().max() <= 1e-10


@pytest.mark.parametrize("family", slow_except(["llama", "gemma3"], "llama"))
def test_local_paths_equal_grafting_every_row_on_the_base(setup, family):
    """The shortcuts against the plain one-pass graft (every row on the base, whole)."""
    base, donors, _, rows, _ = setup(family)

    class Grafting:  # not a LocalExecutor: no row is rerouted
        def run(self, base, donors, plans):
            return LocalExecutor().run(base, donors, plans)

    plain = run_grafts(base, donors, rows, batch_size=6, executor=Grafting())
    fast = run_grafts(base, donors, rows, batch_size=6)
    assert (fast - plain).abs().max() <= TOL


def test_rows_of_one_prompt_share_one_prefix_forward(setup, monkeypatch):
    base, donors, _, _, _ = setup("llama")
    specs = ["LT:q4:o,ffn", "LT:q4:attn", "LT:all:o", "LT:h2:ffn_down", "none"]
    rows = prompt_rows(specs, lengths=(6, 9, 11))
    calls = []
    original = executor.prefix_cache

    def counting(model, prefix, device):
        calls.append(prefix.input_ids.shape)
        return original(model, prefix, device)

    monkeypatch.setattr(executor, "prefix_cache", counting)
    spy = Spy()
    out = run_grafts(base, donors, rows, batch_size=4, executor=spy)
    # 3 prompts (at most 4 per group): one prefix forward; 15 rows, one step (<= 8 x 4 rows)
    assert [shape[0] for shape in calls] == [3]
    assert all(prefix for _, prefix, _ in spy.seen) and len(spy.seen) == 1
    arch = architecture_of(base)
    assert (out - reference(base, donors, arch, rows)).abs().max() <= TOL


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_rows_differing_at_the_last_token_share_a_grafted_prefix(setup, family):
    """FE and FE+LT (and FE^C, (FE+LT)^C) graft the same cells before the last token. With
    a long first entity FE+LT would rather run on the donor and FE on the base: the rows of a
    prompt are put on one carrier and run as steps on one grafted prefix."""
    base, donors, arch, _, _ = setup(family)
    specs = ["FE:all:all", "FE+LT:all:all", "FE^C:all:all", "(FE+LT)^C:all:all"]
    rows = entity_rows(specs, ((6, [1, 2, 3]), (9, [1, 2, 3, 4, 5]), (7, [2])))
    resolved = resolve_rows(arch, rows, donors)
    router = routing._Router(arch, base, donors, set())
    carrier = [
        router.choose(res, len(r.input_ids)).carrier for r, res in zip(rows, resolved, strict=True)
    ]
    assert any(carrier[i] != carrier[i + 1] for i in range(0, len(rows), len(specs)))  # FE, FE+LT
    routes = routing.route_rows(arch, base, rows, resolved, donors, set())
    assert not routes.traced and sum(map(len, routes.prefix.values())) == len(rows)
    spy = Spy()
    out = run_grafts(base, donors, rows, batch_size=4, executor=spy)
    assert all(step for _, step, _ in spy.seen) and {k for _, k in spy.prefixes} == {"grafted"}
    assert (out - reference(base, donors, arch, rows)).abs().max() <= TOL


def test_groups_of_the_same_grafts_share_one_carrier_across_prompts(setup):
    """FE^C and (FE+LT)^C share a grafted prefix on each prompt. On a prompt whose first
    entity is most of it the base would carry them, elsewhere the donor: all such groups go
    to the carrier that does most of their summed work, so they fill one model's batches."""
    base, donors, arch, _, _ = setup("llama")
    specs = ["FE^C:all:all", "(FE+LT)^C:all:all"]
    rows = entity_rows(specs, ((6, [1, 2, 3, 4]), (9, [1, 2]), (11, [2, 3])))
    resolved = resolve_rows(arch, rows, donors)
    router = routing._Router(arch, base, donors, set())
    own = {
        router.choose(res, len(r.input_ids)).carrier for r, res in zip(rows, resolved, strict=True)
    }
    assert own == {None, "sft"}  # on its own, the short prompt's rows would stay on the base
    routes = routing.route_rows(arch, base, rows, resolved, donors, set())
    assert routes.prefix == {"sft": list(range(len(rows)))} and not routes.traced
    spy = Spy()
    out = run_grafts(base, donors, rows, batch_size=4, executor=spy)
    assert spy.prefixes == [(True, "grafted")]  # one prefix forward for the three prompts
    assert (out - reference(base, donors, arch, rows)).abs().max() <= TOL


@pytest.mark.parametrize("family", slow_except(["gpt2", "llama", "gemma3"], "llama"))
def test_large_outputs_are_computed_a_part_of_the_cells_at_a_time(setup, family, monkeypatch):
    """A grafted matrix product whose output on its gathered cells is large (a head's is
    [cells, vocabulary]) runs on parts of the cells; the numbers do not change."""
    import graft.core.execution.trace as trace

    base, donors, _, rows, refs = setup(family)
    monkeypatch.setattr(trace, "PART_ELEMENTS", 200)  # a few cells of the tiny head
    calls = []
    original = trace._put

    def counting(out, mask, cells, values):
        calls.append((out.shape[-1], len(values), cells is not None))
        return original(out, mask, cells, values)

    monkeypatch.setattr(trace, "_put", counting)
    out = run_grafts(base, donors, rows, batch_size=5)
    assert not _off(out, refs, rows), f"{family}: rows off the reference: {_off(out, refs, rows)}"
    vocab = base.config.vocab_size
    flat = [n for width, n, by_cells in calls if width == vocab and by_cells]
    assert flat and max(flat) == 200 // vocab  # the head's cells, two at a time


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_fast_path_is_taken_with_the_installed_versions(family, monkeypatch):
    """Fails on every family whose forward the installed transformers changed so that the
    shared-prefix shortcut would switch off (transformers 5.24 renamed ``past_key_values``
    to ``cache``: before graft knew both, every family ran its rows whole, up to 2x slower)."""
    monkeypatch.setattr(routing, "_warned", set())
    base = tiny_model(family, seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    path = routing.engine_path(base, donors)
    assert path["shared_prefix"] and not path["fallbacks"], path
    assert path["cache_argument"] in CACHE_ARGUMENTS
    spy = Spy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPathWarning)
        run_grafts(base, donors, prompt_rows(["LT:all:all", "LT:q4:o,ffn"]), executor=spy)
    assert spy.seen and all(prefix for _, prefix, _ in spy.seen)  # one-token steps only


@pytest.mark.slow
def test_a_model_without_a_cache_runs_every_row_whole_and_says_so(setup, monkeypatch):
    base, donors, _, rows, refs = setup("gpt2")
    monkeypatch.setattr(routing, "accepts_cache", lambda model: False)
    monkeypatch.setattr(routing, "_warned", set())
    spy = Spy()
    with pytest.warns(SlowPathWarning) as caught:
        out = run_grafts(base, donors, rows, batch_size=5, executor=spy)
        run_grafts(base, donors, rows[:3], batch_size=5)  # said once, not per call
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "no shared-prefix shortcut on GPT2LMHeadModel" in message
    assert "cache, past_key_values" in message and "2x the time" in message
    assert not any(prefix for _, prefix, _ in spy.seen)
    assert not _off(out, refs, rows)
    path = routing.engine_path(base, donors)
    assert not path["shared_prefix"] and len(path["fallbacks"]) == 1


@pytest.mark.slow
def test_a_donor_that_computes_differently_carries_no_row(setup):
    base, donors, arch, rows, refs = setup("qwen2")
    other = perturbed_copy(base, seed=1)  # the same weights as donors["sft"]
    other.config.graft_test_marker = 1  # a configuration the base does not share
    assert not routing.can_carry(arch, base, other)
    both = {"sft": other, "task": donors["task"]}
    out = run_grafts(base, both, rows, batch_size=5)
    assert not _off(out, refs, rows)
    routes = routing.route_rows(arch, base, rows, resolve_rows(arch, rows, both), both, set())
    assert "sft" not in set(routes.traced) | set(routes.prefix) | set(routes.plain)
    used = set(routes.traced) | set(routes.prefix) | set(routes.plain)
    assert "task" in used  # the other donor still carries its rows


def test_which_model_carries_a_row():
    base = tiny_model("llama", seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    arch = architecture_of(base)
    specs = ["FE:all:all", "FE^C:all:all", "LT^C:all:all", "ALL:all:all; head=donor", "none"]
    rows = prompt_rows(specs, lengths=(9,))
    resolved = resolve_rows(arch, rows, donors)
    routes = routing.route_rows(arch, base, rows, resolved, donors, set(), batch_size=1)
    assert routes.traced == {None: [0, 4], "sft": [1]}
    # the donor's own forward joins the donor's prefix, which LT^C computes anyway
    assert routes.prefix == {"sft": [2, 3]}
    assert routes.plain == {}
    alone = routing.route_rows(arch, base, rows[3:4], resolved[3:4], donors, set(), batch_size=1)
    assert alone.plain == {"sft": [0]} and not alone.traced and not alone.prefix
    # FE^C on the donor: the base's modules at FE, and the base's head
    on_donor = routes.resolved[1]
    assert {p for cell in on_donor.cells.values() for p in cell} == {1, 2}
    assert {d for cell in on_donor.cells.values() for d in cell.values()} == {BASE}
    assert on_donor.final_norm_donor == BASE and on_donor.unembed_donor == BASE


def test_a_step_runs_on_the_model_that_computes_its_last_token():
    """LT grafts every module at the last token: its step is the donor's own over the base's
    prefix cache, the base's head grafted back; LT^C's is the base's over the donor's. A
    graft of some modules there stays on its carrier."""
    base = tiny_model("llama", seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    arch = architecture_of(base)
    specs = ["none", "LT:all:all", "LT:all:attn", "LT:all:all; head=donor", "LT^C:all:all"]
    rows = prompt_rows(specs, lengths=(9, 6))
    resolved = resolve_rows(arch, rows, donors)
    routes = routing.route_rows(arch, base, rows, resolved, donors, set(), batch_size=8)
    for prompt in (0, len(specs)):
        assert set(routes.steps) & set(range(prompt, prompt + len(specs))) == {
            prompt + 1,
            prompt + 3,
            prompt + 4,
        }
        model, step = routes.steps[prompt + 1]  # LT: the base's head, nothing else grafted
        assert model == "sft" and not step.cells
        assert step.final_norm_donor == step.unembed_donor == BASE
        assert routes.steps[prompt + 3][0] == "sft" and is_empty(routes.steps[prompt + 3][1])
        assert routes.steps[prompt + 4][0] == BASE and is_empty(routes.steps[prompt + 4][1])
    spy = Spy()
    out = run_grafts(base, donors, rows, batch_size=8, executor=spy)
    assert set(spy.moved_steps) == {False, True}
    assert (out - reference(base, donors, arch, rows)).abs().max() <= TOL


def test_part_filled_batches_of_two_models_are_merged():
    base = tiny_model("llama", seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    arch = architecture_of(base)
    rows = prompt_rows(["FE:all:all", "FE^C:all:all", "none"], lengths=(9,))
    resolved = resolve_rows(arch, rows, donors)
    # batches of 2: the base's [FE, none] fill one, the donor's FE^C stays alone
    assert routing.route_rows(arch, base, rows, resolved, donors, set(), 2).traced == {
        None: [0, 2],
        "sft": [1],
    }
    # batches of 4: one batch, not two; FE^C is the row that costs least on the other side
    routes = routing.route_rows(arch, base, rows, resolved, donors, set(), 4)
    assert routes.traced == {None: [0, 2, 1]}
    assert routes.resolved[1] is resolved[1]  # back on the base, grafted as written
    out = run_grafts(base, donors, rows, batch_size=4)
    assert (out - reference(base, donors, arch, rows)).abs().max() <= TOL


def test_sites_that_share_an_input_gather_it_once(setup, monkeypatch):
    """q, k and v read one input at the same cells: each layer gathers it once for the
    donor and once for the base's own cells (split), not once per site."""
    import graft.core.execution.trace as trace

    base, donors, arch, _, _ = setup("llama")
    monkeypatch.setattr(split_module, "SPLIT_MIN_FEATURES", 0)  # tiny models: split them too
    rows = prompt_rows(specs=["FE:all:qkv"], lengths=(6,))
    calls = []
    original = trace._take

    def spy_take(x, mask, cells):
        calls.append(mask.shape)
        return original(x, mask, cells)

    monkeypatch.setattr(trace, "_take", spy_take)
    out = run_grafts(base, donors, rows, batch_size=1)
    assert not _off(out, reference(base, donors, arch, rows), rows)
    assert len(calls) == 2 * arch.n_layers, calls
