"""The session engine: one call's sans-I/O rooms (DESIGN §2, §3.1); nothing here touches a socket, a
thread, the clock or the event loop."""
