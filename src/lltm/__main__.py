"""``python -m lltm``: print the active backend, what it was built against, and the devices."""

from __future__ import annotations

import json

import torch

import lltm


def main() -> None:
    """Print the build info and the available backends as JSON."""
    info = lltm.build_info()
    report = {
        "backend": info["backend"],
        "build": info,
        "runtime": {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()},
        "backends": lltm.available_backends(),
    }
    print(json.dumps(report, indent=2))  # noqa: T201


if __name__ == "__main__":
    main()
