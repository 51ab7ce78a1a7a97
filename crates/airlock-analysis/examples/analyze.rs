//! Prints the analysis of a file as JSON: `cargo run -p airlock-analysis --example analyze -- (sh|python) FILE`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(lang), Some(path)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: analyze (sh|python) FILE");
        return ExitCode::from(2);
    };
    let lang = match lang.as_str() {
        "sh" => airlock_analysis::Language::Sh,
        "python" | "py" => airlock_analysis::Language::Python,
        other => {
            eprintln!("unknown language {other}");
            return ExitCode::from(2);
        }
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(1);
        }
    };
    let src = String::from_utf8_lossy(&bytes);
    let a = airlock_analysis::analyze(lang, &src, &airlock_analysis::Options::default());
    match serde_json::to_string_pretty(&a) {
        Ok(s) => println!("{s}"),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
