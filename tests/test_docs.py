"""What the README states about the shipped drafters is what their metadata says."""

from pathlib import Path

from dspark_core.eval.shipped import readme_block, shipped_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_table_of_shipped_drafters_is_read_from_their_metadata():
    assert readme_block(README.read_text()) == shipped_table(), (
        "README.md's shipped-drafters table is stale: run python -m dspark_core.eval.shipped --readme README.md")
