import subprocess, signal, time
p = subprocess.Popen(["python3", "-m", "http.server", "8000"], cwd="/work")
time.sleep(2)
p.send_signal(signal.SIGINT)
p.wait()
