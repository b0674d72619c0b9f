"""For tests that Ctrl-C a child process: give the child the default SIGINT action.

A shell starts background jobs with SIGINT ignored, and children inherit that; Python then installs no
KeyboardInterrupt handler, so a SIGINT sent by the test would do nothing (a CI started in the background
timed out on every Ctrl-C test before this). Pass `preexec_fn=restore_sigint` to subprocess.Popen.
"""
import signal


def restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
