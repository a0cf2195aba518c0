"""The checkout must reach the GPU machine, which receives at most 64 MiB (tracked files, untracked files
that are not ignored, and ../shared together): the tracked files stay under 56 MiB."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT_MIB = 56


def test_tracked_files_stay_under_the_limit():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    sizes = {name: (REPO / name).stat().st_size for name in names.split("\0") if name and (REPO / name).is_file()}
    total = sum(sizes.values()) / 2**20
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total < LIMIT_MIB, (f"tracked files take {total:.1f} MiB, over {LIMIT_MIB} MiB; largest: "
                               + ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for name, size in largest))
