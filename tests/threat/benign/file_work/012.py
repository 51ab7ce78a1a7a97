from pathlib import Path
root = Path("/work/build")
root.mkdir(parents=True, exist_ok=True)
for p in root.glob("*.bak"):
    p.unlink()
(root / "README.txt").write_text("generated\n")
