"""The entry of ``scripts/simulate`` (the simulator is the package ``scripts/sim``)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from sim.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
