"""Pre-deploy graft's test models on a running ndif controller (run in the server's venv).

    python deploy_models.py --dir MODELS_DIR [--serve NAME=FOLDER ...]

Deploys, each as one pinned replica of the sandboxing CPU model actor
(``graft_ndif_shims.CPUSandboxModelActor``: trusted requests run in the actor's process,
untrusted ones in a sandbox runner process), in float32:

- ``ship``: graft's tiny llama base (``graft.models.tiny.tiny_model("llama")`` with graft's tiny
  tokenizer), saved to ``MODELS_DIR/tiny-llama`` and served as nnsight's
  ``TransformersModel`` under the key graft's client sends for that path;
- ``hosted``: the graft pair ``graft.tiny:llama`` with donors ``sft`` =
  ``graft.tiny:llama:donor`` and ``relation`` = ``graft.tiny:llama:donor=7``
  (:class:`graft.remote.hosted.GraftPairModel`);
- each ``--serve NAME=FOLDER``: a model saved in FOLDER (``save_pretrained``, with a
  tokenizer), served as nnsight's ``TransformersModel`` behind the in-process CPU actor, in
  the dtype of its config, sized from its safetensors files (``benchmarks/remote_scale.py``
  serves a random-weight gpt2-xl this way).

Sizes are given explicitly: ndif 0.1.2's on-demand sizing calls nnsight's
``describe_checkpoint`` with an argument nnsight 0.8.1 does not take. Prints one JSON line
``{"ship": KEY, "hosted": KEY, "base_dir": DIR}`` last.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ACTOR = "graft_ndif_shims.CPUSandboxModelActor"
TRUSTED_ACTOR = "graft_ndif_shims.CPUModelActor"  # no sandbox runners: less memory
SIZE_BYTES = 64 * 1024 * 1024


def save_tiny_base(path: Path) -> None:
    from graft.models.loading import tiny_tokenizer
    from graft.models.tiny import tiny_model

    model = tiny_model("llama")
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)


def served(name_folder: str) -> tuple[str, Path]:
    """``NAME=FOLDER`` of ``--serve``."""
    name, sep, folder = name_folder.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"--serve takes NAME=FOLDER, got {name_folder!r}")
    return name, Path(folder).resolve()


def saved_spec(name: str, folder: Path) -> dict:
    """Deployment of a saved model (``--serve``): its size and dtype from the folder."""
    from graft.remote.config import hf_model_key

    config = json.loads((folder / "config.json").read_text())
    return {
        "checkpoint": name,
        "model_key": hf_model_key(str(folder)),
        "size_bytes": sum(f.stat().st_size for f in folder.glob("*.safetensors")),
        "padding_bias": 0,
        "dtype": str(config.get("dtype") or config.get("torch_dtype") or "float32"),
        "actor_class": TRUSTED_ACTOR,
        "pinned": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--serve", type=served, action="append", default=[])
    args = parser.parse_args()

    from ndif.cli.lib.deploy import deploy

    from graft.remote.config import hf_model_key
    from graft.remote.hosted import hosted_model_key

    base_dir = args.dir.resolve() / "tiny-llama"
    save_tiny_base(base_dir)
    keys = {
        "ship": hf_model_key(str(base_dir)),
        "hosted": hosted_model_key(
            "graft.tiny:llama",
            {"sft": "graft.tiny:llama:donor", "relation": "graft.tiny:llama:donor=7"},
        ),
    }
    specs = [
        {
            "checkpoint": name,
            "model_key": key,
            "size_bytes": SIZE_BYTES,
            "padding_bias": 0,
            "dtype": "float32",
            "actor_class": ACTOR,
            "pinned": True,
        }
        for name, key in keys.items()
    ]
    for name, folder in args.serve:
        specs.append(saved_spec(name, folder))
        keys[name] = specs[-1]["model_key"]
    result = deploy(
        specs,
        ray_address=os.environ["NDIF_RAY_ADDRESS"],
        redis_url=os.environ["NDIF_REDIS_URL"],
        on_message=print,
    )
    failed = [d for d in result["deployments"] if d["status"] != "READY"]
    if failed:
        raise SystemExit(f"deployment failed: {failed}")
    print(json.dumps({**keys, "base_dir": str(base_dir)}))


if __name__ == "__main__":
    main()
