"""``python -m lltm``: print what lltm was built against and what it can run on."""

from __future__ import annotations

import json

import torch

import lltm


def main() -> None:
    """Print the build info and the available backends as JSON."""
    report = {
        "build": lltm.build_info(),
        "runtime": {"torch": torch.__version__, "cuda_available": torch.cuda.is_available()},
        "backends": lltm.available_backends(),
    }
    print(json.dumps(report, indent=2))  # noqa: T201


if __name__ == "__main__":
    main()
