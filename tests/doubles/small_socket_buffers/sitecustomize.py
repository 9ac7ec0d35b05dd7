"""Test double of a slow network's small socket buffers: on PYTHONPATH, every TCP socket Python makes gets
4 KiB send and receive buffers (accepted connections inherit the listener's).

tests/test_status_reconnect.py puts this folder on the PYTHONPATH of a runner and its ranks, so that a paused
runner's status connections fill in seconds; nothing of it ships in a project.
"""

import socket

BUFFER_BYTES = 4096


class SmallBufferSocket(socket.socket):
    """A socket.socket whose new TCP sockets start with BUFFER_BYTES buffers."""

    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):  # noqa: A002, ANN001, ANN204
        super().__init__(family, type, proto, fileno)
        if fileno is None and self.type == socket.SOCK_STREAM and self.family in (socket.AF_INET, socket.AF_INET6):
            self.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
            self.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)


socket.socket = SmallBufferSocket  # type: ignore[misc]
