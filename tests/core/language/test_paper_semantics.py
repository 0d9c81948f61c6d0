"""``protocol=paper`` grafts what the authors' routine grafts, on every family.

The authors' routine, written again here from their published code's semantics (nothing of
graft's imported for it): for every token it copies the base model, loads the donor's
weights (``load_state_dict``, weight and bias) into each targeted module of each chosen
layer when the token is a grafted position, and runs that one token on the key/value cache
of the tokens before. Its targets are whole modules: on the fused-QKV families (GPT-2's
``attn.c_attn``, GPT-NeoX's ``attention.query_key_value``) its ``q`` is the whole fused
projection and ``k``, ``v`` have no module (they graft nothing). Its layer groups take
``q = L // 4``: quarters ``[0,q) [q,2q) [2q,3q) [3q,L)``, halves as quarter pairs; its E4
hybrid starts at ``L // 2``.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from graft.core.execution.engine import GraftRow, run_grafts
from graft.core.language.spec import parse_spec
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
N_LAYERS = 6  # L mod 4 = 2: the authors' quarters, halves and hybrid split all differ from graft's
IDS = [1, 5, 9, 17, 33, 40, 7, 8, 60, 61]
FE = [1, 2]

#: The authors' targets per family: target -> module path inside a layer.
_LLAMA_LIKE = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
AUTHORS_TARGETS = {
    "gpt2": {"q": "attn.c_attn", "o": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"},
    "gpt_neox": {
        "q": "attention.query_key_value",
        "o": "attention.dense",
        "up": "mlp.dense_h_to_4h",
        "down": "mlp.dense_4h_to_h",
    },
    **{f: _LLAMA_LIKE for f in ("llama", "gemma", "gemma2", "gemma3", "qwen2", "qwen3")},
}
LAYERS_PATH = {"gpt2": "transformer.h", "gpt_neox": "gpt_neox.layers"}
GROUPS = {"attn": ("q", "k", "v"), "ffn": ("gate", "up", "down")}


def authors_layers(selector: str, n_layers: int) -> list[int]:
    """The authors' layer groups."""
    q = n_layers // 4
    quarters = [range(0, q), range(q, 2 * q), range(2 * q, 3 * q), range(3 * q, n_layers)]
    named = {
        "all": range(n_layers),
        "q1": quarters[0],
        "q4": quarters[3],
        "h1": range(0, 2 * q),
        "h2": range(2 * q, n_layers),
        "from_middle": range(n_layers // 2, n_layers),
    }
    return list(named[selector])


def authors_positions(name: str, length: int) -> set[int]:
    last = length - 1
    return {"FE": set(FE), "LT": {last}, "FE+LT": set(FE) | {last}}[name]


def authors_last_logits(family, base, donors, ids, rules) -> torch.Tensor:
    """The authors' routine: ``rules`` are (positions, layer selector, targets, donor)."""
    layers_path = LAYERS_PATH.get(family, "model.layers")
    n_layers = len(base.get_submodule(layers_path))
    loads: dict[int, list[tuple[str, str]]] = {}
    for positions, selector, targets, donor in rules:
        names = [t for g in targets for t in GROUPS.get(g, (g,))]
        for t in authors_positions(positions, len(ids)):
            for layer in authors_layers(selector, n_layers):
                for name in names:
                    if name in AUTHORS_TARGETS[family]:  # k, v of a fused family: no module
                        path = f"{layers_path}.{layer}.{AUTHORS_TARGETS[family][name]}"
                        loads.setdefault(t, []).append((path, donor))
    cache_name = (
        "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    )
    past, logits = None, None
    with torch.no_grad():
        for t in range(len(ids)):
            work = copy.deepcopy(base).eval()
            for path, donor in loads.get(t, []):  # later rules win, as in a spec
                work.get_submodule(path).load_state_dict(
                    donors[donor].get_submodule(path).state_dict()
                )
            out = work(
                input_ids=torch.tensor([[ids[t]]]),
                attention_mask=torch.ones((1, t + 1), dtype=torch.long),
                position_ids=torch.tensor([[t]]),
                use_cache=True,
                **{cache_name: past},
            )
            past = out["cache"] if "cache" in out else out["past_key_values"]
            logits = out.logits[0, -1].float()
    return logits


CASES = [
    ("LT:q4:q", [("LT", "q4", ["q"], "sft")]),
    ("LT:q4:k", [("LT", "q4", ["k"], "sft")]),
    ("LT:q4:v", [("LT", "q4", ["v"], "sft")]),
    ("FE+LT:h1:attn", [("FE+LT", "h1", ["attn"], "sft")]),
    ("LT:h2:o,ffn", [("LT", "h2", ["o", "ffn"], "sft")]),
    ("FE:q1:q,o; LT:all:down", [("FE", "q1", ["q", "o"], "sft"), ("LT", "all", ["down"], "sft")]),
    (
        "LT:from_middle:attn,ffn@task; LT:from_middle:o,up,down@relation",
        [
            ("LT", "from_middle", ["attn", "ffn"], "task"),
            ("LT", "from_middle", ["o", "up", "down"], "relation"),
        ],
    ),
]


@pytest.fixture(scope="module", params=slow_except(TINY_FAMILIES, "llama"))
def models(request):
    base = tiny_model(request.param, seed=0, n_layers=N_LAYERS)
    donors = {
        "sft": perturbed_copy(base, seed=1),
        "task": perturbed_copy(base, seed=2),
        "relation": perturbed_copy(base, seed=3),
    }
    return request.param, base, donors


@pytest.mark.parametrize(("spec", "rules"), CASES, ids=[c[0] for c in CASES])
def test_paper_protocol_equals_the_authors_routine(models, spec, rules):
    family, base, donors = models
    row = GraftRow(IDS, {"FE": FE}, parse_spec(f"{spec}; protocol=paper"))
    got = run_grafts(base, donors, [row])[0]
    want = authors_last_logits(family, base, donors, IDS, rules)
    assert (got - want).abs().max().item() <= TOL


def test_fused_k_and_v_alone_graft_nothing_under_the_paper_protocol_only():
    base = tiny_model("gpt2", seed=0, n_layers=N_LAYERS)
    donor = perturbed_copy(base, seed=1)
    rows = [
        GraftRow(IDS, {"FE": FE}, parse_spec(s))
        for s in ("none", "LT:q4:k; protocol=paper", "LT:q4:k")
    ]
    none, paper_k, graft_k = run_grafts(base, {"sft": donor}, rows)
    assert torch.equal(paper_k, none)
    assert (graft_k - none).abs().max().item() > 1e-4  # graft's own k is an exact slice
