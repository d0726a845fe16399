#!/usr/bin/python3
"""An independent MDS reader and writer in plain Python (numpy, PIL, hashlib, gzip, bz2 and the
zstd command), written from the format description in ../shared/FORMATS.md §5 — not from the C
code — to check the C library both ways (tests/test_mds.c runs it):

    mds_ref.py write DIR COMPRESSION   writes the sample set below with this writer
    mds_ref.py check DIR               reads DIR with this reader and checks it holds the sample set

The sample set (SAMPLES) is a pure function of the sample index; test_mds.c builds the same
values in C. Exit status 0 when everything matches; a message on stderr otherwise.
"""
import bz2
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

N = 23  # samples

# column -> encoding; the writer sorts the names
COLUMNS = {
    'b': 'bytes', 's': 'str', 'i': 'int', 'u8': 'uint8', 'u16': 'uint16', 'u32': 'uint32', 'u64': 'uint64',
    'i8': 'int8', 'i16': 'int16', 'i32': 'int32', 'i64': 'int64', 'f16': 'float16', 'f32': 'float32',
    'f64': 'float64', 'si': 'str_int', 'sf': 'str_float', 'sd': 'str_decimal', 'js': 'json',
    'nd': 'ndarray', 'ndt': 'ndarray:int16', 'nds': 'ndarray:uint8:2,3', 'pil': 'pil', 'png': 'png',
    'jpg': 'jpeg', 'jpx': 'ndarray:uint8', 'lpng': 'list[png]', 'ja': 'jpeg_array',
}


def image(i, h, w, mode):
    """A deterministic test image: a gradient with the index mixed in."""
    c = {'L': 1, 'RGB': 3, 'RGBA': 4}[mode]
    a = (np.arange(h * w * c, dtype=np.int64).reshape(h, w, c) * 37 + i * 11) % 251
    a = a.astype(np.uint8)
    return Image.fromarray(a[:, :, 0] if c == 1 else a, mode)


def png_bytes(img):
    out = io.BytesIO()
    img.save(out, format='PNG')
    return out.getvalue()


def jpeg_bytes(img):
    out = io.BytesIO()
    img.save(out, format='JPEG', quality=90)
    return out.getvalue()


def sample(i):
    """Sample i; the C test (test_mds.c: ref_sample) builds the same values."""
    nd_dtypes = [np.uint8, np.int8, np.uint16, np.int16, np.float16, np.uint32, np.int32, np.float32,
                 np.uint64, np.int64, np.float64]
    dt = nd_dtypes[i % len(nd_dtypes)]
    shape = [(3,), (2, 5), (1, 300), (4, 1, 2)][i % 4]   # (1, 300) needs u16 dims
    nd = (np.arange(int(np.prod(shape))) * (i + 1) % 97).astype(dt).reshape(shape)
    jimg = image(i, 8, 16, 'RGB')
    jb = jpeg_bytes(jimg)
    return {
        'b': bytes([(i * 13 + k) % 256 for k in range(i % 7)]),
        's': 'sample %d \u00e9\u6f22' % i,
        'i': i * 1000003 - 7,
        'u8': i % 256, 'u16': (i * 3001) % 65536, 'u32': (i * 2654435761) % (1 << 32),
        'u64': (i * 11400714819323198485) % (1 << 64), 'i8': (i * 5) % 256 - 128, 'i16': i * 301 - 3000,
        'i32': i * 100003 - 1000000, 'i64': -(i * 10 ** 12) - 1, 'f16': i * 0.5 - 3.25,
        'f32': i * 1.25 - 10.5, 'f64': i / 3.0,
        'si': str(i * 12345 - 99999), 'sf': '%d.%d' % (i, (i * 7) % 10), 'sd': '%d.%02d' % (i, i % 100),
        'js': json.dumps({'i': i, 'name': 'x%d' % i, 'v': [i, i * 2]}),
        'nd': nd, 'ndt': np.arange(i + 1, dtype=np.int16) - 5,
        'nds': (np.arange(6, dtype=np.uint8) + i).reshape(2, 3),
        'pil': image(i, 5, 7, ['L', 'RGB', 'RGBA'][i % 3]),
        'png': png_bytes(image(i, 6, 4, ['L', 'RGB'][i % 2])),
        'jpg': jb,
        'jpx': np.asarray(Image.open(io.BytesIO(jb)).convert('RGB')),
        'lpng': [png_bytes(image(i + k, 3, 3, 'RGB')) for k in range(i % 3)],
        'ja': [jpeg_bytes(image(i + k, 8, 8, 'L')) for k in range(1 + i % 2)],
    }


# ---- encodings (FORMATS.md §5.2) ------------------------------------------------------------

SCALARS = {'int': '<i8', 'uint8': '<u1', 'uint16': '<u2', 'uint32': '<u4', 'uint64': '<u8', 'int8': '<i1',
           'int16': '<i2', 'int32': '<i4', 'int64': '<i8', 'float16': '<f2', 'float32': '<f4', 'float64': '<f8'}
DTYPE_CODES = {'uint8': 8, 'int8': 9, 'uint16': 16, 'int16': 17, 'float16': 18, 'uint32': 32, 'int32': 33,
               'float32': 34, 'uint64': 64, 'int64': 65, 'float64': 66}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}


def u32(v):
    return int(v).to_bytes(4, 'little')


def fixed_size(enc):
    if enc in SCALARS:
        return np.dtype(SCALARS[enc]).itemsize
    parts = enc.split(':')
    if parts[0] == 'ndarray' and len(parts) == 3:
        return int(np.prod([int(x) for x in parts[2].split(',')])) * np.dtype(parts[1]).itemsize
    return None


def encode(enc, v):
    if enc in SCALARS:
        return np.array(v, dtype=SCALARS[enc]).tobytes()
    if enc in ('bytes',):
        return v
    if enc in ('str', 'str_int', 'str_float', 'str_decimal', 'json'):
        return v.encode('utf-8')
    if enc in ('png', 'jpeg'):
        return v
    if enc == 'pil':
        mode = v.mode.encode()
        return u32(v.size[0]) + u32(v.size[1]) + u32(len(mode)) + mode + v.tobytes()
    if enc == 'list[png]':
        return u32(0) + u32(len(v)) + b''.join(u32(len(x)) for x in v) + b''.join(v)
    if enc == 'jpeg_array':
        return u32(len(v)) + b''.join(u32(len(x)) for x in v) + b''.join(v)
    parts = enc.split(':')
    assert parts[0] == 'ndarray'
    out = b''
    if len(parts) < 2:
        out += bytes([DTYPE_CODES[v.dtype.name]])
    if len(parts) < 3:
        mx = max(v.shape)
        w = 0 if mx < 256 else 1 if mx < 65536 else 2 if mx < 2 ** 32 else 3
        out += bytes([(v.ndim << 2) | w]) + np.array(v.shape, dtype=['<u1', '<u2', '<u4', '<u8'][w]).tobytes()
    return out + np.ascontiguousarray(v).astype(v.dtype.newbyteorder('<')).tobytes()


def decode(enc, b):
    if enc in SCALARS:
        return np.frombuffer(b, SCALARS[enc])[0]
    if enc == 'bytes' or enc in ('png', 'jpeg'):
        return bytes(b)
    if enc in ('str', 'str_int', 'str_float', 'str_decimal', 'json'):
        return b.decode('utf-8')
    if enc == 'pil':
        w, h, ml = np.frombuffer(b[:12], '<u4')
        mode = b[12:12 + ml].decode()
        return Image.frombytes(mode, (int(w), int(h)), bytes(b[12 + ml:]))
    if enc in ('list[png]', 'jpeg_array'):
        o = 4 if enc == 'list[png]' else 0
        n = int(np.frombuffer(b[o:o + 4], '<u4')[0])
        sizes = np.frombuffer(b[o + 4:o + 4 + 4 * n], '<u4')
        at, out = o + 4 + 4 * n, []
        for s in sizes:
            out.append(bytes(b[at:at + s]))
            at += int(s)
        assert at == len(b), 'list sizes'
        return out
    parts = enc.split(':')
    at = 0
    if len(parts) < 2:
        dt = CODE_DTYPES[b[0]]
        at = 1
    else:
        dt = parts[1]
    if len(parts) < 3:
        nd, w = b[at] >> 2, b[at] & 3
        at += 1
        shape = tuple(int(x) for x in np.frombuffer(b[at:at + nd * (1 << w)], ['<u1', '<u2', '<u4', '<u8'][w]))
        at += nd * (1 << w)
    else:
        shape = tuple(int(x) for x in parts[2].split(','))
    return np.frombuffer(b[at:], np.dtype(dt).newbyteorder('<')).reshape(shape)


# ---- compression and files --------------------------------------------------------------------

def snappy_decompress(b):
    """Raw snappy block format (varint length, then literals and copies)."""
    n, shift, at = 0, 0, 0
    while True:
        c = b[at]
        at += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            break
    out = bytearray()
    while at < len(b):
        tag = b[at]
        at += 1
        t = tag & 3
        if t == 0:
            ln = tag >> 2
            if ln >= 60:
                k = ln - 59
                ln = int.from_bytes(b[at:at + k], 'little')
                at += k
            ln += 1
            out += b[at:at + ln]
            at += ln
            continue
        if t == 1:
            ln = ((tag >> 2) & 7) + 4
            off = ((tag >> 5) << 8) | b[at]
            at += 1
        elif t == 2:
            ln = (tag >> 2) + 1
            off = int.from_bytes(b[at:at + 2], 'little')
            at += 2
        else:
            ln = (tag >> 2) + 1
            off = int.from_bytes(b[at:at + 4], 'little')
            at += 4
        for _ in range(ln):
            out.append(out[-off])
    assert len(out) == n, 'snappy length'
    return bytes(out)


def compress(family, data):
    if family == 'gz':
        return gzip.compress(data, 9)
    if family == 'bz2':
        return bz2.compress(data, 9)
    if family == 'zstd':
        return subprocess.run(['zstd', '-q', '-c', '-3'], input=data, capture_output=True, check=True).stdout
    raise SystemExit('mds_ref.py: cannot compress with ' + family)


def decompress(family, data):
    if family == 'gz':
        return gzip.decompress(data)
    if family == 'bz2':
        return bz2.decompress(data)
    if family == 'zstd':
        return subprocess.run(['zstd', '-q', '-d', '-c'], input=data, capture_output=True, check=True).stdout
    if family == 'snappy':
        return snappy_decompress(data)
    raise SystemExit('mds_ref.py: cannot decompress ' + family)


def file_info(basename, data, hashes):
    return {'basename': basename, 'bytes': len(data),
            'hashes': {h: hashlib.new(h, data).hexdigest() for h in hashes}}


def write(out, compression):
    os.makedirs(out, exist_ok=True)
    names = sorted(COLUMNS)
    encs = [COLUMNS[k] for k in names]
    sizes = [fixed_size(e) for e in encs]
    hashes = ['md5', 'sha1']
    limit = 12000
    config = {'column_encodings': encs, 'column_names': names, 'column_sizes': sizes,
              'compression': compression, 'format': 'mds', 'hashes': hashes, 'size_limit': limit, 'version': 2}
    config_text = json.dumps(config, sort_keys=True).encode()
    shards, records = [], []

    def flush():
        if not records:
            return
        n = len(records)
        offsets = [4 + 4 * (n + 1) + len(config_text)]
        for r in records:
            offsets.append(offsets[-1] + len(r))
        raw = u32(n) + b''.join(u32(o) for o in offsets) + config_text + b''.join(records)
        base = 'shard.%05d.mds' % len(shards)
        obj = dict(config)
        obj.update({'raw_data': file_info(base, raw, hashes), 'samples': n, 'zip_data': None})
        if compression:
            family = compression.split(':')[0]
            z = compress(family, raw)
            obj['zip_data'] = file_info(base + '.' + family, z, hashes)
            open(os.path.join(out, base + '.' + family), 'wb').write(z)
        else:
            open(os.path.join(out, base), 'wb').write(raw)
        shards.append(obj)
        records.clear()

    size = 8 + len(config_text)
    for i in range(N):
        s = sample(i)
        head, body = b'', b''
        for k, e, z in zip(names, encs, sizes):
            d = encode(e, s[k])
            if z is None:
                head += u32(len(d))
            else:
                assert len(d) == z, k
            body += d
        rec = head + body
        if size + len(rec) + 4 > limit and records:
            flush()
            size = 8 + len(config_text)
        records.append(rec)
        size += len(rec) + 4
    flush()
    with open(os.path.join(out, 'index.json'), 'w') as f:
        json.dump({'shards': shards, 'version': 2}, f, sort_keys=True)


def same(k, got, want):
    if isinstance(want, Image.Image):
        ok = isinstance(got, Image.Image) and got.mode == want.mode and got.size == want.size and \
            got.tobytes() == want.tobytes()
    elif isinstance(want, np.ndarray):
        ok = isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape and \
            got.tobytes() == want.tobytes()
    elif isinstance(want, float):
        ok = float(got) == float(np.array(want, dtype=SCALARS[COLUMNS[k]]))
    else:
        ok = got == want
    if not ok:
        raise SystemExit('mds_ref.py: column %s: got %r, want %r' % (k, got, want))


def check(d):
    index = json.load(open(os.path.join(d, 'index.json')))
    assert index['version'] == 2, 'index version'
    i = 0
    for sh in index['shards']:
        assert sh['format'] == 'mds' and sh['version'] == 2
        raw_info, zip_info = sh['raw_data'], sh['zip_data']
        if zip_info:
            z = open(os.path.join(d, zip_info['basename']), 'rb').read()
            assert len(z) == zip_info['bytes'], 'zip size'
            for h, v in zip_info['hashes'].items():
                if h in hashlib.algorithms_available:
                    assert hashlib.new(h, z).hexdigest() == v, 'zip hash ' + h
            raw = decompress(sh['compression'].split(':')[0], z)
        else:
            raw = open(os.path.join(d, raw_info['basename']), 'rb').read()
        assert len(raw) == raw_info['bytes'], 'raw size'
        for h, v in raw_info['hashes'].items():
            if h in hashlib.algorithms_available:
                assert hashlib.new(h, raw).hexdigest() == v, 'raw hash ' + h
        n = int(np.frombuffer(raw[:4], '<u4')[0])
        assert n == sh['samples'], 'sample count'
        offsets = np.frombuffer(raw[4:4 + 4 * (n + 1)], '<u4')
        cfg = json.loads(raw[4 + 4 * (n + 1):offsets[0]])
        for k in ('column_encodings', 'column_names', 'column_sizes', 'compression', 'hashes', 'size_limit'):
            assert cfg[k] == sh[k], 'shard config ' + k
        assert raw[4 + 4 * (n + 1):offsets[0]] == json.dumps(cfg, sort_keys=True).encode(), 'config json text'
        names, encs, sizes = sh['column_names'], sh['column_encodings'], sh['column_sizes']
        for j in range(n):
            rec = raw[offsets[j]:offsets[j + 1]]
            at, lens = 0, []
            for z in sizes:
                if z is None:
                    lens.append(int(np.frombuffer(rec[at:at + 4], '<u4')[0]))
                    at += 4
                else:
                    lens.append(z)
            want = sample(i)
            for k, e, ln in zip(names, encs, lens):
                same(k, decode(e, rec[at:at + ln]), want[k])
                at += ln
            assert at == len(rec), 'record length'
            i += 1
    assert i == N, 'got %d samples, want %d' % (i, N)


if __name__ == '__main__':
    if len(sys.argv) >= 3 and sys.argv[1] == 'write':
        write(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != 'none' else None)
    elif len(sys.argv) == 3 and sys.argv[1] == 'check':
        check(sys.argv[2])
    else:
        raise SystemExit(__doc__)
