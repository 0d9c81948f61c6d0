"""``--protocol paper`` in ``component``, ``layers``, ``tokens`` and ``custom``, end to end on
tiny models: the layers, head and donor each run actually used, read back from its folder.

The layer checks need a model whose layer count 4 does not divide: on a 6-layer model the
paper's rule (``q = L // 4``) gives quarters 0, 1, 2, 3-5 where graft's gives 0, 1-2, 3, 4-5.
Its embeddings are tied, so the paper head policy has something to swap. GPT-2's ``all``
(token embedding, no ``pos_embed``, under the paper protocol) is checked on ``tiny-gpt2``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from graft.core.families.arch import Architecture, architecture_of
from graft.core.language.selectors import layer_group, paper_layer_group
from graft.core.language.spec import GraftSpec
from graft.models.loading import tiny_tokenizer
from graft.models.tiny import tiny_model
from graft.results.report import LAYER_SEP
from graft.study.specs.grafts import FUSED_QKV_NOTE
from graft_experiments.cli import main
from tests.cli.tiny_runs import tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

N_LAYERS = 6
#: a prompt shape to resolve specs on: 6 tokens, the first entity at 1-2
LENGTH, SPANS = 6, {"FE": [1, 2]}


@pytest.fixture(scope="module")
def model6(tmp_path_factory) -> Path:
    """A tied 6-layer tiny Llama saved as a model folder (``--model`` takes folders)."""
    folder = tmp_path_factory.mktemp("models") / "tiny6"
    tiny_model("llama", tied=True, n_layers=N_LAYERS).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def arch6() -> Architecture:
    arch = architecture_of(tiny_model("llama", tied=True, n_layers=N_LAYERS))
    assert arch.tied_embeddings
    return arch


def _run(command: str, model, workspace: Path, out: Path, *args: str):
    result = CliRunner().invoke(
        main,
        [
            command,
            *args,
            "--allow-weak-donor",  # a random model folder learns nothing in 2 steps
            *tiny_args(
                workspace, model=model, n_facts=4, n=1, n_boot=10, templates="headline", out=out
            ),
        ],
        catch_exceptions=False,
    )
    return result


def _ok(command: str, model, workspace: Path, out: Path, *args: str):
    result = _run(command, model, workspace, out, *args)
    assert result.exit_code == 0, result.output
    return result, json.loads((out / "config.json").read_text())


def _ran_specs(out: Path) -> dict[str, GraftSpec]:
    """graft -> the spec its rows ran with (stored per row in examples.parquet)."""
    table = pl.read_parquet(out / "examples.parquet").select("graft", "spec").unique()
    return {g: GraftSpec.parse(s) for g, s in table.iter_rows()}


def _layers(spec: GraftSpec, arch: Architecture, component: str) -> list[int]:
    """Layers where ``spec`` grafts ``component`` at the last token on ``arch``."""
    cells = spec.resolve(arch, LENGTH, SPANS).cells
    return sorted(i for (i, c), at in cells.items() if c == component and LENGTH - 1 in at)


def _donor_data(config: dict, name: str = "sft") -> str:
    """The dataset folder a donor was finetuned on (its direction and protocol)."""
    path = Path(config["donors"][name]["path"])
    return path.relative_to(Path(config["options"]["workspace"])).parts[2]


def test_the_two_rules_differ_on_the_test_model():
    assert paper_layer_group(4, 4, N_LAYERS) == [3, 4, 5] != layer_group(4, 4, N_LAYERS)
    assert paper_layer_group(2, 4, N_LAYERS) == [1] != layer_group(2, 4, N_LAYERS)


# ----------------------------------------------------------------------------- component


def test_component_under_the_paper_protocol(model6, arch6, workspace, tmp_path):
    out = tmp_path / "component"
    result, config = _ok(
        "component", model6, workspace, out, "--protocol", "paper", "--split-qkv", "--fe", "all"
    )
    assert f"note: {FUSED_QKV_NOTE}" in result.output
    for pair in ("sft", "reversal"):
        pair_config = json.loads((out / pair / "config.json").read_text())
        assert pair_config["options"]["protocol"] == "paper"
        assert pair_config["options"]["head_policy"] == "paper"
        assert pair_config["protocol_notes"] == [FUSED_QKV_NOTE]
        specs = _ran_specs(out / pair)
        o_ffn = specs["O+FFN"]
        assert o_ffn.head == "paper" and o_ffn.protocol == "paper"
        assert _layers(o_ffn, arch6, "o") == [3, 4, 5]  # the paper's last quarter
        assert _layers(specs["Q"], arch6, "q") == [3, 4, 5] and not _layers(specs["Q"], arch6, "k")
        # SFT is the both-direction model in both pairs (sft2pre and both2one)
        assert _donor_data(pair_config) == "fake_movies_real_actors-paper-both-n4-seed0"
    reversal = json.loads((out / "reversal" / "config.json").read_text())
    assert "fake_movies_real_actors-paper-one-n4-seed0" in reversal["base"]["path"]
    assert config["options"]["protocol"] == "paper" and config["pairs"] == ["sft", "reversal"]


def test_component_defaults_stay_grafts(model6, arch6, workspace, tmp_path):
    out = tmp_path / "component"
    result = _run("component", model6, workspace, out, "--pairs", "sft", "--split-qkv")
    assert result.exit_code == 0, result.output
    config = json.loads((out / "sft" / "config.json").read_text())  # one pair: no combined
    assert "note:" not in result.output and "protocol_notes" not in config
    assert config["options"]["protocol"] == "graft" and config["options"]["head_policy"] == "base"
    o_ffn = _ran_specs(out / "sft")["O+FFN"]
    assert o_ffn.head == "base" and o_ffn.protocol == "graft"
    assert _layers(o_ffn, arch6, "o") == [4, 5]
    assert _donor_data(config) == "fake_movies_real_actors-one-n4-seed0"


def test_component_refuses_a_layer_group_the_papers_rule_lacks(model6, workspace, tmp_path):
    out = tmp_path / "component"
    result = _run("component", model6, workspace, out, "--protocol", "paper", "--layers", "e8")
    assert result.exit_code == 2 and "halves and quarters only" in result.output
    assert not out.exists()


# -------------------------------------------------------------------------------- layers


def test_layers_under_the_paper_protocol(model6, arch6, workspace, tmp_path):
    out = tmp_path / "layers"
    _, config = _ok("layers", model6, workspace, out, "--protocol", "paper", "--positions", "LT")
    specs = _ran_specs(out)
    # quarters by default (the paper's rule has no eighths), resolved by that rule
    windows = [f"LT{LAYER_SEP}q{k}" for k in range(1, 5)]
    assert sorted(g for g in specs if g.startswith("LT")) == windows
    for k, window in enumerate(windows, 1):
        spec = specs[window]
        assert spec.head == "paper"
        assert _layers(spec, arch6, "o") == paper_layer_group(k, 4, N_LAYERS)
    assert config["options"]["protocol"] == "paper"
    assert _donor_data(config) == "fake_movies_real_actors-paper-both-n4-seed0"


def test_layers_defaults_stay_grafts(model6, arch6, workspace, tmp_path):
    out = tmp_path / "layers"
    args = ("--positions", "LT", "--windows", "quarters")
    _, config = _ok("layers", model6, workspace, out, *args)
    spec = _ran_specs(out)[f"LT{LAYER_SEP}q2"]
    assert spec.head == "base" and _layers(spec, arch6, "o") == [1, 2]
    assert config["options"]["protocol"] == "graft"
    assert _donor_data(config) == "fake_movies_real_actors-one-n4-seed0"


def test_layers_paper_protocol_refuses_eighths_and_keeps_an_explicit_variant(
    model6, workspace, tmp_path
):
    out = tmp_path / "eighths"
    result = _run("layers", model6, workspace, out, "--protocol", "paper", "--windows", "eighths")
    assert result.exit_code == 2 and "halves and quarters only" in result.output
    assert not out.exists()
    out = tmp_path / "one"
    args = ("--protocol", "paper", "--variant", "one", "--positions", "LT", "--windows", "halves")
    _, config = _ok("layers", model6, workspace, out, *args)
    assert _donor_data(config) == "fake_movies_real_actors-paper-one-n4-seed0"


# -------------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("protocol", ["paper", "graft"])
def test_tokens_gpt2_all_head_and_donor_follow_the_protocol(protocol, workspace, tmp_path):
    out = tmp_path / "tokens"
    _, config = _ok("tokens", "tiny-gpt2", workspace, out, "--protocol", protocol)
    arch = architecture_of(tiny_model("gpt2"))
    fe_lt = _ran_specs(out)["FE+LT"]
    cells = fe_lt.resolve(arch, LENGTH, SPANS).cells
    paper = protocol == "paper"
    assert ((-1, "pos_embed") in cells) is not paper and (-1, "embed") in cells
    assert fe_lt.head == ("paper" if paper else "base")
    assert config["options"]["protocol"] == protocol
    data = "paper-both" if paper else "one"
    assert _donor_data(config) == f"fake_movies_real_actors-{data}-n4-seed0"
    assert (out / "top_tokens.csv").is_file()


# -------------------------------------------------------------------------------- custom


def test_custom_under_the_paper_protocol(model6, arch6, workspace, tmp_path):
    out = tmp_path / "custom"
    specs_given = ("--spec", "LT:q4:o", "--spec", "mine=LT:q4:o; protocol=graft; head=base")
    _, config = _ok("custom", model6, workspace, out, "--protocol", "paper", *specs_given)
    specs = _ran_specs(out)
    # the run's protocol and head policy where a spec sets neither; what a spec writes wins
    assert specs["LT:q4:o"].head == "paper" and _layers(specs["LT:q4:o"], arch6, "o") == [3, 4, 5]
    assert specs["mine"].head == "base" and _layers(specs["mine"], arch6, "o") == [4, 5]
    assert _donor_data(config) == "fake_movies_real_actors-paper-both-n4-seed0"
    assert config["dataset"]["path"].endswith("fake_movies_real_actors-paper-both-n4-seed0")


def test_custom_defaults_stay_grafts_and_an_explicit_donor_wins(model6, arch6, workspace, tmp_path):
    out = tmp_path / "graft"
    _, config = _ok("custom", model6, workspace, out, "--spec", "LT:q4:o")
    spec = _ran_specs(out)["LT:q4:o"]
    assert spec.head == "base" and _layers(spec, arch6, "o") == [4, 5]
    assert config["options"]["protocol"] == "graft"
    assert _donor_data(config) == "fake_movies_real_actors-one-n4-seed0"
    out = tmp_path / "paper-one"
    args = ("--protocol", "paper", "--donor", "sft=one", "--spec", "LT:q4:o")
    _, config = _ok("custom", model6, workspace, out, *args)
    assert _donor_data(config) == "fake_movies_real_actors-paper-one-n4-seed0"
    assert _layers(_ran_specs(out)["LT:q4:o"], arch6, "o") == [3, 4, 5]
