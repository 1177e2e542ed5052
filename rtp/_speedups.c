/* The compiled twins of the media path's per-packet functions (rtp/speedups.py chooses them at import).

   Each function here answers exactly as its pure-Python twin does, for every input (the parity test,
   tests/unit/rtp/test_speedups_parity.py, holds them equal): the common case is done here, and any input
   outside it (another buffer type, a non-int field, a buffer too small) is handed to the pure twin, so an
   error or an odd result is the pure one's. CPython C API only; no allocation beyond the result objects the
   pure twins allocate too.

   parse(data)                          rtp.packet.parse: an RtpPacket, or the Drop member saying why not
   pack_into(buf, pt, m, seq, ts, ssrc, payload)   rtp.packet.pack_into: the 12-byte header and the payload
   g711_decode(table, pure, payload)    rtp.jitter.table_decoder's frame decoder: 8-bit codes to PCM16LE by a
                                        512-byte table (the 256 samples of the codec's decode, little-endian)
   recv_stamped(sock, size)             rtp.endpoint's recv_stamped (IPv4 sockets): one datagram, its source and
                                        the kernel's receive time (SO_TIMESTAMPNS), without an exception for
                                        an empty socket
   send_batch(socks, datagrams, addresses, results)   rtp.endpoint `send_all`: a media-clock tick's RTP, one
                                        sendto each on non-blocking IPv4 sockets; results[i] 0 sent, 1 refused
                                        (an OSError); a destination that is not a numeric IPv4 pair goes to
                                        socket.sendto itself. Returns how many were refused.
                                        (The GIL is held over each sendto(2): on a non-blocking socket, as
                                        RtpSocketPair binds them, it never waits; a socket with a timeout is
                                        refused at once where socket.sendto would wait for room.)
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static PyObject *packet_type = NULL;   /* rtp.packet.RtpPacket (a tuple subclass without a __dict__) */
static PyObject *drops = NULL;         /* tuple of the rtp.packet.Drop members, by value */
static PyObject *pure_parse = NULL;
static PyObject *pure_pack_into = NULL;

enum { TOO_SHORT = 0, BAD_VERSION = 1, BAD_CSRC = 2, BAD_EXTENSION = 3, BAD_PADDING = 4, EMPTY_PAYLOAD = 5 };

static PyObject *
drop(int reason)
{
    PyObject *member = PyTuple_GET_ITEM(drops, reason);
    Py_INCREF(member);
    return member;
}

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *cls, *members, *parse_fn, *pack_fn;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &cls, &PyTuple_Type, &members, &parse_fn, &pack_fn))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) || PyTuple_GET_SIZE(members) <= EMPTY_PAYLOAD) {
        PyErr_SetString(PyExc_ValueError, "setup(RtpPacket, tuple(Drop), parse, pack_into)");
        return NULL;
    }
    Py_INCREF(cls);
    Py_INCREF(members);
    Py_INCREF(parse_fn);
    Py_INCREF(pack_fn);
    Py_XSETREF(packet_type, cls);
    Py_XSETREF(drops, members);
    Py_XSETREF(pure_parse, parse_fn);
    Py_XSETREF(pure_pack_into, pack_fn);
    Py_RETURN_NONE;
}

static int
ready(void)
{
    if (packet_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rtp._speedups.setup() was not called");
        return 0;
    }
    return 1;
}

static PyObject *
parse(PyObject *self, PyObject *data)
{
    if (!ready())
        return NULL;
    if (!PyBytes_CheckExact(data))  /* bytearray, memoryview, ...: the pure twin's answer */
        return PyObject_CallOneArg(pure_parse, data);
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n < 12)
        return drop(TOO_SHORT);
    unsigned int b0 = p[0], b1 = p[1];
    if ((b0 & 0xC0) != 0x80)
        return drop(BAD_VERSION);
    Py_ssize_t offset = 12, end = n;
    if (b0 & 0x3F) {
        offset = 12 + 4 * (Py_ssize_t)(b0 & 0x0F);
        if (offset > n)
            return drop(BAD_CSRC);
        if (b0 & 0x10) {  /* header extension (RFC 3550 5.3.1): skipped */
            if (offset + 4 > n)
                return drop(BAD_EXTENSION);
            offset += 4 + 4 * (Py_ssize_t)((p[offset + 2] << 8) | p[offset + 3]);
            if (offset > n)
                return drop(BAD_EXTENSION);
        }
        if (b0 & 0x20) {  /* padding (5.1): the last octet counts the padding octets, itself included */
            Py_ssize_t pad = p[n - 1];
            if (pad == 0 || pad > n - offset)
                return drop(BAD_PADDING);
            end = n - pad;
        }
    }
    if (end <= offset)
        return drop(EMPTY_PAYLOAD);
    unsigned long seq = ((unsigned long)p[2] << 8) | p[3];
    unsigned long ts = ((unsigned long)p[4] << 24) | ((unsigned long)p[5] << 16) | ((unsigned long)p[6] << 8) | p[7];
    unsigned long ssrc =
        ((unsigned long)p[8] << 24) | ((unsigned long)p[9] << 16) | ((unsigned long)p[10] << 8) | p[11];
    PyObject *packet = ((PyTypeObject *)packet_type)->tp_alloc((PyTypeObject *)packet_type, 6);
    if (packet == NULL)
        return NULL;
    PyObject *items[6];
    items[0] = PyLong_FromLong((long)(b1 & 0x7F));
    items[1] = PyBool_FromLong(b1 >= 0x80);
    items[2] = PyLong_FromUnsignedLong(seq);
    items[3] = PyLong_FromUnsignedLong(ts);
    items[4] = PyLong_FromUnsignedLong(ssrc);
    items[5] = PyBytes_FromStringAndSize((const char *)p + offset, end - offset);
    for (int i = 0; i < 6; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 6; j++)
                Py_XDECREF(items[j]);
            Py_DECREF(packet);
            return NULL;
        }
    }
    for (int i = 0; i < 6; i++)
        PyTuple_SET_ITEM(packet, i, items[i]);
    return packet;
}

static PyObject *
pack_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!ready())
        return NULL;
    if (kwnames != NULL || nargs != 7 || !PyByteArray_CheckExact(args[0]))
        goto pure;
    for (int i = 1; i < 6; i++)
        if (i != 2 && !PyLong_Check(args[i]))
            goto pure;
    int marker = PyObject_IsTrue(args[2]);
    if (marker < 0)
        return NULL;
    unsigned long long pt = PyLong_AsUnsignedLongLongMask(args[1]);
    unsigned long long seq = PyLong_AsUnsignedLongLongMask(args[3]);
    unsigned long long ts = PyLong_AsUnsignedLongLongMask(args[4]);
    unsigned long long ssrc = PyLong_AsUnsignedLongLongMask(args[5]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[6], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        goto pure;
    }
    Py_ssize_t n = 12 + view.len;
    if (PyByteArray_GET_SIZE(args[0]) < n) {  /* the pure twin grows the buffer: leave it that */
        PyBuffer_Release(&view);
        goto pure;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(args[0]);
    out[0] = 0x80;
    out[1] = (unsigned char)((marker ? 0x80 : 0) | (pt & 0x7F));
    out[2] = (unsigned char)(seq >> 8);
    out[3] = (unsigned char)seq;
    out[4] = (unsigned char)(ts >> 24);
    out[5] = (unsigned char)(ts >> 16);
    out[6] = (unsigned char)(ts >> 8);
    out[7] = (unsigned char)ts;
    out[8] = (unsigned char)(ssrc >> 24);
    out[9] = (unsigned char)(ssrc >> 16);
    out[10] = (unsigned char)(ssrc >> 8);
    out[11] = (unsigned char)ssrc;
    memmove(out + 12, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
pure:
    return PyObject_Vectorcall(pure_pack_into, args, (size_t)nargs, kwnames);
}

static PyObject *
g711_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || PyBytes_GET_SIZE(args[0]) != 512) {
        PyErr_SetString(PyExc_TypeError, "g711_decode(table: 512 bytes, pure, payload)");
        return NULL;
    }
    PyObject *payload = args[2];
    if (!PyBytes_CheckExact(payload))  /* bytearray, ...: the pure twin's answer */
        return PyObject_CallOneArg(args[1], payload);
    const unsigned char *table = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    const unsigned char *in = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t n = PyBytes_GET_SIZE(payload);
    PyObject *result = PyBytes_FromStringAndSize(NULL, 2 * n);
    if (result == NULL)
        return NULL;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *sample = table + 2 * in[i];
        out[2 * i] = sample[0];
        out[2 * i + 1] = sample[1];
    }
    return result;
}

static unsigned char datagram[65536];

static PyObject *
recv_stamped(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "recv_stamped(sock, size)");
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(args[0]);
    if (fd < 0) {  /* a closed socket (fileno() -1): recvmsg's own error, as the pure read gets it */
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return NULL;
        PyErr_Clear();
        errno = EBADF;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0 || size > (Py_ssize_t)sizeof(datagram)) {
        PyErr_SetString(PyExc_ValueError, "recv_stamped: size out of range");
        return NULL;
    }
    struct sockaddr_storage source;
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {datagram, (size_t)size};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_name = &source;
    msg.msg_namelen = sizeof(source);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    ssize_t n = recvmsg(fd, &msg, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            Py_RETURN_NONE;  /* nothing waiting (the pure twin: BlockingIOError, InterruptedError) */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (source.ss_family != AF_INET) {
        PyErr_SetString(PyExc_OSError, "recv_stamped reads IPv4 sockets only");
        return NULL;
    }
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)&source;
    char host[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host)) == NULL)
        return PyErr_SetFromErrno(PyExc_OSError);
    long long stamp = -1;
    struct cmsghdr *first = CMSG_FIRSTHDR(&msg);  /* the first ancillary item only, as the pure twin reads it */
    if (first != NULL && first->cmsg_level == SOL_SOCKET && first->cmsg_type == SO_TIMESTAMPNS &&
        first->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
        struct timespec ts;
        memcpy(&ts, CMSG_DATA(first), sizeof(ts));
        stamp = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    return Py_BuildValue("(y#(si)L)", (const char *)datagram, (Py_ssize_t)(n > size ? size : n), host,
                         (int)ntohs(in4->sin_port), stamp);
}

/* The IPv4 destination of `address` when it is what the pure sendto reads as one without a name lookup: a
   2-tuple of a dotted-quad str (CPython's own numeric check, inet_pton) and an int port 0..65535. 0 for
   anything else (a name, IPv6, another type, a port out of range): that entry is the pure sendto's. */
static int
ipv4_destination(PyObject *address, struct sockaddr_in *out)
{
    if (!PyTuple_Check(address) || PyTuple_GET_SIZE(address) != 2)
        return 0;
    PyObject *host = PyTuple_GET_ITEM(address, 0), *port = PyTuple_GET_ITEM(address, 1);
    if (!PyUnicode_Check(host) || !PyLong_CheckExact(port))
        return 0;
    Py_ssize_t size;
    const char *name = PyUnicode_AsUTF8AndSize(host, &size);
    if (name == NULL) {
        PyErr_Clear();
        return 0;
    }
    int overflow;
    long number = PyLong_AsLongAndOverflow(port, &overflow);
    if (overflow || number < 0 || number > 0xFFFF || (Py_ssize_t)strlen(name) != size)
        return 0;
    memset(out, 0, sizeof(*out));
    out->sin_family = AF_INET;
    out->sin_port = htons((unsigned short)number);
    return inet_pton(AF_INET, name, &out->sin_addr) == 1;
}

/* One datagram by the pure path (socket.sendto): 0 sent, 1 refused (OSError), -1 another exception. */
static int
send_pure(PyObject *sock, PyObject *datagram, PyObject *address)
{
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("sendto")) == NULL)
        return -1;
    PyObject *done = PyObject_CallMethodObjArgs(sock, name, datagram, address, NULL);
    if (done != NULL) {
        Py_DECREF(done);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_OSError))
        return -1;
    PyErr_Clear();
    return 1;
}

/* socket.socket and _socket.socket: only an object of exactly one of these is sent on here (any other, a
   subclass that may send otherwise included, goes to its own sendto), and only an AF_INET one (read by
   _socket.socket's own `family` member, without socket.socket's enum): an AF_INET6 socket reads an IPv4
   address its own way (a name lookup, which refuses it) */
static PyObject *socket_types[2] = {NULL, NULL};
static PyObject *family_member = NULL;

static int
is_ipv4_socket(PyObject *sock)
{
    PyObject *kind = (PyObject *)Py_TYPE(sock);
    if (kind != socket_types[0] && kind != socket_types[1])
        return 0;
    PyObject *family = Py_TYPE(family_member)->tp_descr_get(family_member, sock, kind);
    if (family == NULL) {
        PyErr_Clear();
        return 0;
    }
    long value = PyLong_Check(family) ? PyLong_AsLong(family) : -1;
    Py_DECREF(family);
    if (value == -1 && PyErr_Occurred())
        PyErr_Clear();
    return value == AF_INET;
}

static int
load_socket_types(void)
{
    const char *modules[2] = {"socket", "_socket"};
    for (int i = 0; i < 2; i++) {
        if (socket_types[i] != NULL)
            continue;
        PyObject *module = PyImport_ImportModule(modules[i]);
        if (module == NULL)
            return 0;
        socket_types[i] = PyObject_GetAttrString(module, "socket");
        Py_DECREF(module);
        if (socket_types[i] == NULL)
            return 0;
    }
    if (family_member == NULL) {
        family_member = PyObject_GetAttrString(socket_types[1], "family");
        if (family_member == NULL)
            return 0;
        if (Py_TYPE(family_member)->tp_descr_get == NULL) {
            Py_CLEAR(family_member);
            PyErr_SetString(PyExc_TypeError, "_socket.socket.family is not a descriptor");
            return 0;
        }
    }
    return 1;
}

static PyObject *
send_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2]) ||
        !PyByteArray_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "send_batch(socks: list, datagrams: list, addresses: list, results)");
        return NULL;
    }
    PyObject *socks = args[0], *datagrams = args[1], *addresses = args[2];
    Py_ssize_t n = PyList_GET_SIZE(socks);
    if (PyList_GET_SIZE(datagrams) != n || PyList_GET_SIZE(addresses) != n || PyByteArray_GET_SIZE(args[3]) < n) {
        PyErr_SetString(PyExc_ValueError, "send_batch: lists of one length, results at least as long");
        return NULL;
    }
    if (!load_socket_types())
        return NULL;
    Py_ssize_t failed = 0;
    /* (the sizes are read again each round: a socket's own sendto is Python code, which may change them) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(socks) && i < PyList_GET_SIZE(datagrams) &&
                           i < PyList_GET_SIZE(addresses) && i < PyByteArray_GET_SIZE(args[3]);
         i++) {
        PyObject *sock = PyList_GET_ITEM(socks, i), *datagram = PyList_GET_ITEM(datagrams, i);
        PyObject *address = PyList_GET_ITEM(addresses, i);
        Py_INCREF(sock);
        Py_INCREF(datagram);
        Py_INCREF(address);
        struct sockaddr_in to;
        Py_buffer view;
        int outcome;
        if (!is_ipv4_socket(sock) || !ipv4_destination(address, &to)) {
            outcome = send_pure(sock, datagram, address);
        } else if (PyObject_GetBuffer(datagram, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            outcome = send_pure(sock, datagram, address);  /* not a buffer: the pure twin's TypeError */
        } else {
            int fd = PyObject_AsFileDescriptor(sock);
            if (fd < 0) {
                /* a closed socket (fileno() -1): refused, as sendto refuses it (EBADF) */
                outcome = PyErr_ExceptionMatches(PyExc_ValueError) ? 1 : -1;
                if (outcome == 1)
                    PyErr_Clear();
            } else {
                ssize_t sent;
                do  /* EINTR: sent again, as CPython's sendto does (PEP 475) */
                    sent = sendto(fd, view.buf, (size_t)view.len, 0, (struct sockaddr *)&to, sizeof(to));
                while (sent < 0 && errno == EINTR);
                outcome = sent < 0;  /* EAGAIN (buffer full), unreachable, ...: refused */
            }
            PyBuffer_Release(&view);
        }
        Py_DECREF(sock);
        Py_DECREF(datagram);
        Py_DECREF(address);
        if (outcome < 0)
            return NULL;  /* results of this entry and the ones after it are left as they were */
        if (i < PyByteArray_GET_SIZE(args[3]))
            PyByteArray_AS_STRING(args[3])[i] = (char)outcome;
        failed += outcome;
    }
    return PyLong_FromSsize_t(failed);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(RtpPacket, tuple(Drop), parse, pack_into): the pure module's types"},
    {"parse", parse, METH_O, "rtp.packet.parse, compiled"},
    {"pack_into", (PyCFunction)(void (*)(void))pack_into, METH_FASTCALL | METH_KEYWORDS,
     "rtp.packet.pack_into, compiled"},
    {"g711_decode", (PyCFunction)(void (*)(void))g711_decode, METH_FASTCALL,
     "g711_decode(table, pure, payload): G.711 codes to PCM16LE by the codec's 512-byte decode table"},
    {"recv_stamped", (PyCFunction)(void (*)(void))recv_stamped, METH_FASTCALL,
     "recv_stamped(sock, size): (datagram, (host, port), kernel receive ns or -1), or None when none waits"},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL,
     "send_batch(socks, datagrams, addresses, results): sendto of each, results[i] 0 sent / 1 refused; refused"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rtp._speedups", "The compiled twins of rtp's per-packet functions.", -1, methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
