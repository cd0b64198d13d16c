"""The program every sandbox command runs under, in the sandbox (see `sandbox.py` on how one command runs).

It is a string handed to `python -c`, not a module of this package: it runs with whatever Python the sandbox has
(old images have 3.6, hence its old-style code), nothing of the harness is importable there, and as a module file
of the package, importing it would run it. Both backends use the same text, so a command behaves alike in both.
"""

SUPERVISOR = r'''
import os, signal, sys, time
limit = float(sys.argv[1])
purge_user = sys.argv[2] == "user"
rlimits = [item.split("=") for item in sys.argv[3].split(",") if item]
argv = sys.argv[4:]
try:  # become the reaper of the command's orphans, so that killed ones do not linger as zombies
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except OSError:
            return
try:
    pid = os.fork()
except OSError as exc:
    sys.stderr.write("supervisor: cannot fork: %s\n" % exc)
    sys.stderr.flush()
    os._exit(125)
if pid == 0:
    os.setpgid(0, 0)
    try:
        for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores these; a shell command must not inherit that
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        import resource
        for name, value in rlimits:
            which = getattr(resource, "RLIMIT_" + name.upper())
            resource.setrlimit(which, (int(value), int(value)))
        os.execvp(argv[0], argv)
    except Exception as exc:
        sys.stderr.write("%s: %s\n" % (argv[0], exc))
        sys.stderr.flush()
    os._exit(127)
try:
    os.setpgid(pid, pid)
except OSError:
    pass
expired = []
def on_alarm(signum, frame):
    expired.append(1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, limit)
while True:
    try:
        status = os.waitpid(pid, 0)[1]
        break
    except InterruptedError:
        continue
signal.setitimer(signal.ITIMER_REAL, 0)
for _ in range(400):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        break
    time.sleep(0.002)
    reap()
def survivors():
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/status" % name) as fh:
                fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        except (IOError, OSError):
            continue
        if fields.get("Uid", "").split()[:1] == [str(os.getuid())] and "Z" not in fields.get("State", "")[:3]:
            found.append(int(name))
    return found
if purge_user:
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(200):
        alive = survivors()
        if not alive:
            break
        for other in alive:
            try:
                os.kill(other, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)
        reap()
if expired:
    code = 124
elif os.WIFEXITED(status):
    code = os.WEXITSTATUS(status)
else:
    code = 128 + os.WTERMSIG(status)
os._exit(code)
'''
"""Runs `argv` in its own process group with rlimits; kills the group at the deadline and when it returns.

Arguments: timeout seconds; "group" or "user" (after the command, also kill every process of the calling
user with kill(-1): only for an unprivileged user alone in a container, never locally, never as root);
rlimits as "cpu=10,as=1073741824" (may be empty); then the command. Exit code: the command's, 128+signal if a
signal ended it, 124 at the deadline, 125 if the supervisor could not fork, 127 if the command could not be
executed. Kept compatible with old Pythons (3.6) because it runs with whatever Python the image has."""
