#!/usr/bin/env python3
"""seed.py: writes the kept seed corpora of the fuzz targets (tests/fuzz/corpus/).

Run from the repository root: python3 tests/fuzz/seed.py. Seeds come from
real inputs: the shipped GGUF's header region (trimmed to a valid file with
no tensors, and truncated at many offsets), synthetic GGUFs with hostile
counts and sizes, the shipped specs and prompt files, and protocol request
lines. The corpora are small on purpose: make fuzz grows them in a scratch
folder, and only inputs that found a bug are copied back (regressions/).
"""
import os, struct, sys

ROOT = os.getcwd()
OUT = os.path.join(ROOT, "tests/fuzz/corpus")
MODEL = os.path.join(ROOT, "models/tiny-trained-qwen3-Q4_K_M.gguf")

def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# ---- GGUF ------------------------------------------------------------------
def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b

def kv_u32(k, v): return gstr(k) + struct.pack("<II", 4, v)
def kv_str(k, v): return gstr(k) + struct.pack("<I", 8) + gstr(v)

def gguf(kvs, tensors, data=b"", n_kv=None, n_t=None, align=32, version=3):
    h = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_t is None else n_t,
                               len(kvs) if n_kv is None else n_kv)
    body = h + b"".join(kvs)
    for name, dims, typ, off in tensors:
        body += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        body += struct.pack("<IQ", typ, off)
    pad = (-len(body)) % align
    return body + b"\0" * pad + data

def model_header():
    """The shipped model's metadata with the tensor count set to 0, cut after
    the key/value section: a valid GGUF of the real tokenizer metadata."""
    b = open(MODEL, "rb").read()
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    p = 24
    def skip_val(t, p):
        fixed = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
        if t in fixed: return p + fixed[t]
        if t == 8:
            n, = struct.unpack_from("<Q", b, p); return p + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p); p += 12
            for _ in range(n): p = skip_val(et, p)
            return p
        raise ValueError(t)
    for _ in range(n_kv):
        n, = struct.unpack_from("<Q", b, p); p += 8 + n
        t, = struct.unpack_from("<I", b, p); p += 4
        p = skip_val(t, p)
    kv_end = p
    hdr = b[:8] + struct.pack("<QQ", 0, n_kv) + b[24:kv_end]
    return b, kv_end, hdr + b"\0" * ((-len(hdr)) % 32)

def seeds_gguf():
    full, kv_end, trimmed = model_header()
    put("gguf", "model-no-tensors.gguf", trimmed)
    for cut in (0, 3, 4, 8, 16, 23, 24, 31, 40, 100, 1000, 4096):
        put("gguf", "model-cut-%d.gguf" % cut, full[:cut])
    # the first tensor infos of the real file, with the data section cut off
    put("gguf", "model-tensor-infos.gguf", full[:kv_end + 2048])
    good = [kv_u32("general.alignment", 32), kv_str("general.architecture", "qwen3")]
    t = [("w", [32, 2], 0, 0)]  # F32 32x2
    put("gguf", "tiny-ok.gguf", gguf(good, t, b"\0" * 256))
    put("gguf", "tiny-q8.gguf", gguf(good, [("q", [64], 8, 0)], b"\0" * 68))
    put("gguf", "huge-n-kv.gguf", gguf(good, t, b"\0" * 256, n_kv=(1 << 63) + 5))
    put("gguf", "huge-n-tensors.gguf", gguf(good, t, b"\0" * 256, n_t=(1 << 62)))
    put("gguf", "huge-string.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", (1 << 64) - 1) + b"k" * 64)
    put("gguf", "huge-dims.gguf", gguf(good, [("w", [1 << 40, 1 << 40], 0, 0)], b"\0" * 64))
    put("gguf", "dims-wrap.gguf", gguf(good, [("w", [1 << 62, 8], 0, 0)], b"\0" * 64))
    put("gguf", "offset-past-end.gguf", gguf(good, [("w", [8], 0, 1 << 50)], b"\0" * 64))
    put("gguf", "offset-unaligned.gguf", gguf(good, [("w", [8], 0, 3)], b"\0" * 64))
    put("gguf", "bad-type.gguf", gguf(good, [("w", [8], 99, 0)], b"\0" * 64))
    put("gguf", "q4k-bad-row.gguf", gguf(good, [("w", [100], 12, 0)], b"\0" * 512))
    put("gguf", "n-dims-9.gguf", gguf(good, [("w", [1] * 9, 0, 0)], b"\0" * 64))
    put("gguf", "align-0.gguf", gguf([kv_u32("general.alignment", 0)], t, b"\0" * 256))
    put("gguf", "align-3.gguf", gguf([kv_u32("general.alignment", 3)], t, b"\0" * 256, align=3))
    put("gguf", "dup-key.gguf", gguf([kv_u32("a", 1), kv_u32("a", 2)], []))
    put("gguf", "dup-tensor.gguf", gguf(good, [("w", [8], 0, 0), ("w", [8], 0, 32)], b"\0" * 64))
    arr = gstr("arr") + struct.pack("<IIQ", 9, 4, (1 << 61)) + b"\0" * 8
    put("gguf", "huge-array.gguf", gguf([arr], []))
    nested = gstr("nest") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) + b"\0" * 4
    put("gguf", "nested-array-3.gguf", gguf([nested], []))
    strarr = gstr("s") + struct.pack("<IIQ", 9, 8, 2) + gstr("ab") + struct.pack("<Q", 1 << 40)
    put("gguf", "string-array-overrun.gguf", gguf([strarr], []))
    put("gguf", "bad-vtype.gguf", gguf([gstr("x") + struct.pack("<I", 77) + b"\0" * 8], []))
    put("gguf", "version-2.gguf", gguf(good, t, b"\0" * 256, version=2))
    put("gguf", "long-name.gguf", gguf(good, [("n" * 300, [8], 0, 0)], b"\0" * 64))

# ---- tokenizer ---------------------------------------------------------------
def seeds_tokenizer():
    texts = {
        "plain": "The following options are supported:",
        "code": "def __init__(self, *args, **kwargs):\n    return None\n",
        "spaces": "   leading and  double  spaces\t\ttabs\n\n\nnewlines  ",
        "digits": "1234567890 3.14159 1e-10 0x7fff",
        "unicode": "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600 \u0410\u0411\u0412",
        "special": "<|im_start|>user\nhi<|im_end|><|endoftext|>",
        "contractions": "I'm you're we'll they've don't IT'S",
        "empty": "",
    }
    for k, v in texts.items():
        for flags in (0, 3, 7):
            put("tokenizer", "%s-%d" % (k, flags), bytes([flags]) + v.encode())
    put("tokenizer", "invalid-utf8", b"\x00\xff\xfe\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc")
    put("tokenizer", "lead-f5", b"\x02ab\xf5\x80\x80\x80cd")
    put("tokenizer", "truncated-utf8", b"\x01\xe6\x97")
    put("tokenizer", "nuls", b"\x00a\x00b\x00\x00c")
    put("tokenizer", "ids-range", b"\x04" + struct.pack("<iiii", 0, 8191, 8192, -1))
    put("tokenizer", "long-run", b"\x00" + b"a" * 5000)
    put("tokenizer", "long-digits", b"\x00" + b"9" * 3000)
    for name in ("manpy6.txt", "tokenizer_corpus.txt"):
        p = os.path.join(ROOT, "specs/prompts", name)
        if os.path.exists(p):
            put("tokenizer", "prompts-" + name, b"\x00" + open(p, "rb").read()[:4000])

# ---- spec --------------------------------------------------------------------
def seeds_spec():
    put("spec", "default.yaml", open(os.path.join(ROOT, "specs/default.yaml"), "rb").read())
    base = ("name: s\nmodel: {path: models/tiny-trained-qwen3-Q4_K_M.gguf, sha256: %s}\n"
            "prompts: [{id: p1, text: hi}]\nsteps: 4\ntop_k: 4\nlegs: 2\nreference: r\n"
            "policy: {kind: exact}\narms:\n  - {name: r, engine: ref}\n" % ("ab" * 32))
    put("spec", "minimal.yaml", base)
    put("spec", "exec.yaml", base + "  - {name: x, exec: [tg-fault-arm, ok], timeout: 0.5}\n")
    put("spec", "command.yaml", base + "  - {name: c, command: [echo, \"{model}\", \"{prompt}\", \"{steps}\"], role: custody}\n")
    put("spec", "llama-wrap.yaml", base + "  - {name: l, llama: {lib: /x/libllama.so, wrap: [qemu-aarch64, -L, /y], options: {threads: 2}}}\n")
    put("spec", "near-tie.yaml", base.replace("{kind: exact}", "{kind: near-tie, band: 0.5}"))
    put("spec", "free.yaml", base + "mode: free\n")
    put("spec", "steps-huge.yaml", base.replace("steps: 4", "steps: 99999999999999999999999"))
    put("spec", "steps-neg.yaml", base.replace("steps: 4", "steps: -4"))
    put("spec", "legs-float.yaml", base.replace("legs: 2", "legs: 1e308"))
    put("spec", "band-nan.yaml", base.replace("{kind: exact}", "{kind: near-tie, band: .nan}"))
    put("spec", "unknown-key.yaml", base + "stepz: 3\n")
    put("spec", "dup-arm.yaml", base + "  - {name: r, engine: cpu}\n")
    put("spec", "no-ref.yaml", base.replace("reference: r", "reference: nobody"))
    put("spec", "anchors.yaml", "a: &x [*x]\n")
    put("spec", "alias-bomb.yaml", "a: &a [x,x,x,x]\nb: &b [*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b]\nd: [*c,*c,*c,*c]\n")
    put("spec", "tabs.yaml", "name:\ts\n\tmodel: x\n")
    put("spec", "binary.yaml", b"\x00\xff\xfename: \x01\n")
    put("spec", "deep.yaml", "[" * 200 + "]" * 200)
    put("spec", "dash-model.yaml", base.replace("models/tiny-trained-qwen3-Q4_K_M.gguf", "--help"))
    put("spec", "dash-lib.yaml", base + "  - {name: l, llama: {lib: --version}}\n")
    put("spec", "prompt-file.yaml", base.replace("prompts: [{id: p1, text: hi}]", "prompts: specs/prompts/manpy6.txt"))
    put("spec", "timeouts.yaml", base + "timeout: {request: 1e-300, leg: 1e300}\n")
    put("spec", "fault-patterns.yaml", base + "fault_patterns: [\"\", \"a\", 3]\n")

# ---- protocol ----------------------------------------------------------------
def seeds_proto():
    L = {
        "hello": '{"op":"hello","protocol":1}',
        "hello-v2": '{"op":"hello","protocol":2}',
        "load": '{"op":"load","model":"/m.gguf","options":{"threads":2}}',
        "load-badopt": '{"op":"load","model":"/m.gguf","options":{"threads":1e99,"x":1}}',
        "load-enum": '{"op":"load","model":"-x","options":{"mode":"b","flag":true}}',
        "tokenize": '{"op":"tokenize","text":"The capital of France is","special":false}',
        "tokenize-nul": '{"op":"tokenize","text":"a\\u0000b","special":true}',
        "detokenize": '{"op":"detokenize","ids":[1,2,3],"special":true}',
        "detokenize-bad": '{"op":"detokenize","ids":[1,-2,99999999999]}',
        "decode": '{"op":"decode","prompt":[1,2,3],"steps":4,"top_k":8}',
        "decode-force": '{"op":"decode","prompt":[5],"steps":3,"top_k":2,"force":[1,2,3]}',
        "decode-dump": '{"op":"decode","prompt":[5],"steps":2,"dump":{"steps":[1,0],"path":"/nonexistent"}}',
        "decode-huge": '{"op":"decode","prompt":[1],"steps":2147483648,"top_k":4294967297}',
        "decode-float": '{"op":"decode","prompt":[1.5],"steps":1e300}',
        "decode-empty": '{"op":"decode","prompt":[],"steps":1}',
        "decode-force-short": '{"op":"decode","prompt":[1],"steps":5,"force":[1]}',
        "bye": '{"op":"bye"}',
        "bye-extra": '{"op":"bye","x":1}',
        "dup-key": '{"op":"hello","op":"bye"}',
        "not-object": '[1,2,3]',
        "garbage": 'this is not JSON {',
        "deep": '[' * 5000 + ']' * 5000,
        "unknown-op": '{"op":"explode"}',
        # answer lines, for the harness's step-line parser
        "step-ok": '{"step":0,"token":5,"top":[[5,10.5],[3,10.5],[7,-1e30]],"digest":"0123456789abcdef"}',
        "step-unordered": '{"step":0,"token":5,"top":[[5,1.0],[3,2.0]]}',
        "step-token-huge": '{"step":0,"token":4294967296,"top":[[4294967296,1.0]]}',
        "step-nan": '{"step":0,"token":1,"top":[[1,1e999],[2,-1e999]],"digest":"xyz"}',
        "step-tie-order": '{"step":0,"token":2,"top":[[2,1.0],[1,1.0]]}',
        "step-dup": '{"step":0,"step":0,"token":1,"top":[[1,1]]}',
    }
    for k, v in L.items():
        put("proto", k, v + "\n")
    put("proto", "session", "\n".join([L["hello"], L["load"], L["tokenize"], L["decode"], L["decode-force"], L["bye"]]) + "\n")

if __name__ == "__main__":
    seeds_gguf(); seeds_tokenizer(); seeds_spec(); seeds_proto()
    for t in sorted(os.listdir(OUT)):
        print(t, len(os.listdir(os.path.join(OUT, t))))
