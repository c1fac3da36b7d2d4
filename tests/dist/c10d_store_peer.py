#!/usr/bin/env python3
"""PyTorch's c10d TCPStore wire protocol, written here from its description
(not from loom's code), to check loom's TCPStore client and server against it:

  every connection starts with  VALIDATE(0) u32 0x3C85F7CE       (no answer)
  SET(1) key value                                   -> nothing
  COMPARE_SET(2) key expected desired                -> value now stored
  GET(3) key                                         -> value
  ADD(4) key i64                                     -> i64 (stored as decimal text)
  CHECK(5) u64 n, n keys                             -> u8 0 ready / 1 not ready
  WAIT(6) u64 n, n keys                              -> u8 0 (stop waiting) once all exist
  GETNUMKEYS(7)                                      -> i64
  DELETE_KEY(8) key                                  -> i64 number deleted
  CANCEL_WAIT(12)                                    -> u8 1 (wait canceled)
  PING(13) u32                                       -> the same u32
Keys and values are a u64 length then the bytes; integers little endian.
PyTorch's TCPStore client sends every key with "/" in front ("/alpha" for
"alpha"), so a client of the same store sees "/name" for a key named "name".

Usage: c10d_store_peer.py LOOM_STORE_TOOL
Runs (1) loom's server against this client, (2) loom's client against this
server, (3) this client and loom's client sharing loom's server.
"""
import socket
import struct
import subprocess
import sys
import threading
import time

MAGIC = 0x3C85F7CE
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
CANCEL_WAIT, PING = 12, 13

failures = []


def expect(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def blob(data):
    if isinstance(data, str):
        data = data.encode()
    return struct.pack("<Q", len(data)) + data


def keys(names):
    return struct.pack("<Q", len(names)) + b"".join(blob(k) for k in names)


class Client:
    def __init__(self, port, validate=True):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if validate:
            self.sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC))

    def recv(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError("server closed the connection")
            data += chunk
        return data

    def value(self):
        (n,) = struct.unpack("<Q", self.recv(8))
        return self.recv(n)

    def set(self, key, value):
        self.sock.sendall(bytes([SET]) + blob(key) + blob(value))

    def get(self, key):
        self.sock.sendall(bytes([GET]) + blob(key))
        return self.value()

    def add(self, key, delta):
        self.sock.sendall(bytes([ADD]) + blob(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self.recv(8))[0]

    def check(self, names):
        self.sock.sendall(bytes([CHECK]) + keys(names))
        return self.recv(1)[0]

    def num_keys(self):
        self.sock.sendall(bytes([GETNUMKEYS]))
        return struct.unpack("<q", self.recv(8))[0]


def client_transcript(port):
    c = Client(port)
    c.set("alpha", b"one")
    expect(c.get("alpha") == b"one", "SET then GET")
    c.set("binary", bytes([0, 1, 255, 0, 7]))
    expect(c.get("binary") == bytes([0, 1, 255, 0, 7]), "binary value")
    expect(c.add("counter", 5) == 5, "ADD to a new key answers 5")
    expect(c.add("counter", -2) == 3, "ADD -2 answers 3")
    expect(c.get("counter") == b"3", "a counter is stored as decimal text")
    expect(c.check(["alpha", "counter"]) == 0, "CHECK of present keys: READY (0)")
    expect(c.check(["alpha", "nope"]) == 1, "CHECK with a missing key: NOT_READY (1)")
    expect(c.num_keys() == 3, "GETNUMKEYS counts 3 keys")
    c.sock.sendall(bytes([WAIT]) + keys(["alpha"]))
    expect(c.recv(1) == b"\x00", "WAIT on a present key: STOP_WAITING at once")
    # A WAIT answered when another client sets the key.
    c.sock.sendall(bytes([WAIT]) + keys(["late", "alpha"]))
    time.sleep(0.2)
    other = Client(port)
    other.set("late", b"x")
    expect(c.recv(1) == b"\x00", "WAIT answered after another client's SET")
    # A WAIT given up on: CANCEL_WAIT answers WAIT_CANCELED.
    c.sock.sendall(bytes([WAIT]) + keys(["never"]))
    time.sleep(0.1)
    c.sock.sendall(bytes([CANCEL_WAIT]))
    expect(c.recv(1) == b"\x01", "CANCEL_WAIT answers WAIT_CANCELED (1)")
    other.set("never", b"y")  # must not wake the cancelled wait
    expect(c.add("counter", 1) == 4, "the connection is usable after a cancelled wait")
    c.sock.sendall(bytes([COMPARE_SET]) + blob("alpha") + blob(b"one") + blob(b"two"))
    expect(c.value() == b"two", "COMPARE_SET with the right expected value swaps")
    c.sock.sendall(bytes([COMPARE_SET]) + blob("alpha") + blob(b"one") + blob(b"three"))
    expect(c.value() == b"two", "COMPARE_SET with a stale expected value keeps the value")
    c.sock.sendall(bytes([DELETE_KEY]) + blob("binary"))
    expect(struct.unpack("<q", c.recv(8))[0] == 1, "DELETE_KEY answers 1")
    c.sock.sendall(bytes([PING]) + struct.pack("<I", 4242))
    expect(struct.unpack("<I", c.recv(4))[0] == 4242, "PING echoes its number")
    # A client that sets a key and exits at once (the SET and the end of its
    # stream may reach the server in one read): the key is stored.
    for i in range(20):
        last = Client(port)
        last.set(f"last{i}", b"z")
        last.sock.close()
    c.sock.sendall(bytes([WAIT]) + keys([f"last{i}" for i in range(20)]))
    try:
        stored = c.recv(1) == b"\x00"
    except socket.timeout:
        stored = False
    expect(stored, "a SET sent just before closing is stored")
    # A connection that skips the handshake is closed without an answer.
    rogue = Client(port, validate=False)
    rogue.sock.sendall(bytes([GET]) + blob("alpha"))
    try:
        closed = rogue.sock.recv(1) == b""
    except (ConnectionResetError, socket.timeout):
        closed = True
    expect(closed, "a connection without VALIDATE is closed")


class Server:
    """A c10d store server: one thread per connection, a condition for waits."""

    def __init__(self):
        self.data = {}
        self.cond = threading.Condition()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        def recv(n):
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise EOFError
                data += chunk
            return data

        def string():
            (n,) = struct.unpack("<Q", recv(8))
            return recv(n)

        def key_list():
            (n,) = struct.unpack("<Q", recv(8))
            return [string() for _ in range(n)]

        try:
            if recv(1)[0] != VALIDATE or struct.unpack("<I", recv(4))[0] != MAGIC:
                return conn.close()
            pending = None  # keys of a WAIT not yet answered
            conn.settimeout(0.05)
            while True:
                if pending is not None:
                    with self.cond:
                        if all(k in self.data for k in pending):
                            conn.sendall(b"\x00")
                            pending = None
                try:
                    query = recv(1)[0]
                except socket.timeout:
                    continue
                conn.settimeout(None)
                with self.cond:
                    if query == SET:
                        k, v = string(), string()
                        self.data[k] = v
                    elif query == GET:
                        conn.sendall(blob(self.data.get(string(), b"")))
                    elif query == ADD:
                        k = string()
                        (delta,) = struct.unpack("<q", recv(8))
                        value = int(self.data.get(k, b"0")) + delta
                        self.data[k] = str(value).encode()
                        conn.sendall(struct.pack("<q", value))
                    elif query == CHECK:
                        names = key_list()
                        conn.sendall(b"\x00" if all(k in self.data for k in names) else b"\x01")
                    elif query == WAIT:
                        pending = key_list()
                    elif query == CANCEL_WAIT:
                        if pending is not None and all(k in self.data for k in pending):
                            conn.sendall(b"\x00")
                        pending = None
                        conn.sendall(b"\x01")
                    elif query == GETNUMKEYS:
                        conn.sendall(struct.pack("<q", len(self.data)))
                    else:
                        return conn.close()
                conn.settimeout(0.05)
        except (EOFError, ConnectionResetError, BrokenPipeError):
            conn.close()


def start_loom_server(tool):
    process = subprocess.Popen([tool, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline())


def main():
    tool = sys.argv[1]

    print("-- (1) loom's server, this client", flush=True)
    process, port = start_loom_server(tool)
    try:
        client_transcript(port)
    finally:
        process.stdin.close()
        process.wait(timeout=10)

    print("-- (2) this server, loom's client", flush=True)
    server = Server()
    result = subprocess.run([tool, "client", str(server.port)], timeout=60)
    expect(result.returncode == 0, "loom's client against this server")

    print("-- (3) this client and loom's client sharing loom's server", flush=True)
    process, port = start_loom_server(tool)
    try:
        c = Client(port)
        c.set("/from_python", b"c10d")
        result = subprocess.run([tool, "exchange", str(port)], timeout=60)
        expect(result.returncode == 0, "loom's client in the shared store")
        c.sock.sendall(bytes([WAIT]) + keys(["/from_loom"]))
        expect(c.recv(1) == b"\x00", "WAIT for loom's key")
        expect(c.get("/from_loom") == b"d01c", "loom's value reached this client, under /from_loom")
        expect(c.add("/shared_counter", 1) == 11, "one counter shared by both")
    finally:
        process.stdin.close()
        process.wait(timeout=10)

    if failures:
        print(f"FAIL: {len(failures)} check(s) failed")
        return 1
    print("ok: loom's TCPStore speaks the c10d protocol as described, as client and as server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
