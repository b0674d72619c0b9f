"""pytest plugin for the fallback sandbox (no network namespace): every socket connection fails."""
import socket


class NetworkBlocked(OSError):
    pass


def _refuse(*args, **kwargs):
    raise NetworkBlocked("network access is disabled in the TRACE scenario sandbox")


socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.socket.sendto = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
