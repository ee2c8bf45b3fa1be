#!/usr/bin/python3
"""loom's f32 -> FP8 conversion (kernels/cpu/fp8.cpp) against a reference written from the OCP
8-bit floating point specification (v1.0, 2023) by brute force: every finite value of the format
is listed from its bit fields, and each input goes to the nearest listed value in exact rational
arithmetic, ties to the code with an even mantissa, saturating at the largest finite value.
(Debian 12's PyTorch 1.13 has no torch.float8_e4m3fn / float8_e5m2; this table is the
independent source instead, and it does not share loom's frexp/nearbyint algorithm.)

Usage:  /usr/bin/python3 tests/torch_ref/check_fp8_cast.py DIR
DIR holds inputs.f32 (little-endian float32), e4m3.u8 and e5m2.u8 (loom's code per input).
Exit 0 when every code matches, 1 on a mismatch (the first ten printed), 2 on a bad dump.
"""
import array
import bisect
import math
import os
import sys
from fractions import Fraction

FORMATS = {  # name: (exponent bits, mantissa bits, bias, has infinities)
    "e4m3": (4, 3, 7, False),
    "e5m2": (5, 2, 15, True),
}


def finite_values(name):
    """(value, code) for every finite non-negative code of the format."""
    e_bits, m_bits, bias, ieee = FORMATS[name]
    out = []
    for code in range(128):
        field, mant = code >> m_bits, code & ((1 << m_bits) - 1)
        top = (1 << e_bits) - 1
        if ieee and field == top:
            continue  # infinities and NaNs
        if not ieee and field == top and mant == (1 << m_bits) - 1:
            continue  # e4m3fn's NaN
        if field == 0:
            value = Fraction(mant, 1 << m_bits) * Fraction(2) ** (1 - bias)
        else:
            value = (1 + Fraction(mant, 1 << m_bits)) * Fraction(2) ** (field - bias)
        out.append((value, code))
    return sorted(out)


def is_nan_code(name, code):
    e_bits, m_bits, _, ieee = FORMATS[name]
    field, mant = (code & 0x7F) >> m_bits, code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    return field == top and (mant != 0 if ieee else mant == (1 << m_bits) - 1)


def reference_code(name, table, x):
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return None  # any NaN code
    largest, largest_code = table[-1]
    if math.isinf(x) or Fraction(abs(x)) >= largest:
        return sign | largest_code
    a = Fraction(abs(x))
    values = [v for v, _ in table]
    i = bisect.bisect_left(values, a)  # values[i - 1] < a <= values[i]
    above = table[i]
    below = table[i] if values[i] == a else table[i - 1]
    d_below, d_above = a - below[0], above[0] - a
    if d_below < d_above:
        code = below[1]
    elif d_above < d_below:
        code = above[1]
    else:
        code = below[1] if below[1] % 2 == 0 else above[1]
    return sign | code


def main(directory):
    try:
        inputs = array.array("f")
        inputs.frombytes(open(os.path.join(directory, "inputs.f32"), "rb").read())
        codes = {n: open(os.path.join(directory, n + ".u8"), "rb").read() for n in FORMATS}
    except OSError as e:
        print(f"bad dump: {e}")
        return 2
    if sys.byteorder != "little":
        inputs.byteswap()
    bad = 0
    for name in FORMATS:
        if len(codes[name]) != len(inputs):
            print(f"bad dump: {len(codes[name])} {name} codes for {len(inputs)} inputs")
            return 2
        table = finite_values(name)
        for x, got in zip(inputs, codes[name]):
            want = reference_code(name, table, x)
            ok = is_nan_code(name, got) if want is None else got == want
            if not ok:
                bad += 1
                if bad <= 10:
                    print(f"{name}: {x!r} -> loom 0x{got:02x}, reference {'NaN' if want is None else hex(want)}")
    print(f"{len(inputs)} inputs x {len(FORMATS)} formats, {bad} mismatch(es)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
