"""`geniex pull <org/repo>[:<precision>]`: download a model, or register local GGUFs."""
import sys

from geniex import config
from geniex.store import Store
from geniex.store.display import human_size


def register(sub):
    """Add the ``pull`` parser."""
    p = sub.add_parser(
        "pull", help="download a model from the Hugging Face Hub (or register local GGUFs)",
        description="Download org/repo[:precision] from the Hugging Face Hub into the store "
                    "(HF_ENDPOINT selects another hub or a mirror; token: GENIEX_HFTOKEN > HF_TOKEN > "
                    "~/.cache/huggingface/token). Without a precision: Q4_0, Q4_K_M, Q8_0, then the rest. "
                    "An interrupted pull resumes where it stopped.")
    p.add_argument("name", metavar="ORG/REPO[:PRECISION]")
    p.add_argument("--local-path", metavar="FILE_OR_DIR", help="register GGUF files already on disk instead of downloading")
    p.add_argument("--model-type", choices=["llm", "vlm"], help="override the detected model type")
    p.set_defaults(func=run)


def run(args):
    store = Store(config.data_dir(getattr(args, "data_dir", None)))
    try:
        model = store.pull(args.name, local_path=args.local_path, model_type=args.model_type, out=sys.stderr)
    except KeyboardInterrupt:
        print(f"\ninterrupted; run `geniex pull {args.name}` again to resume", file=sys.stderr)
        return 130
    print(f"{model.name} is already present" if getattr(model, "already_present", False) else f"Pulled {model.name}")
    for label, value in (("type", model.type), ("runtime", model.runtime), ("size", human_size(model.size)),
                         ("location", model.location), ("precision", model.precision)):
        print(f"  {label + ':':<10} {value}")
    return 0
