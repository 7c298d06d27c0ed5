"""The official openai client's embeddings call against lm-serve: by
default (it asks for base64 and decodes it itself), with floats, and with
base64 asked explicitly (the client hands the string over; decoded here as
little-endian float32), it reads the vectors the server answered as JSON
floats (argv[3]) for the texts (argv[2]), bit for bit.

Usage: embeddings.py BASE_URL TEXTS_JSON VECTORS_JSON
"""

import base64
import json
import struct
import sys

import openai


def as_f32(values):
    return [struct.unpack("<f", struct.pack("<f", float(x)))[0] for x in values]


def main():
    base_url, texts, expected = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    expected = [as_f32(v) for v in expected]
    for encoding in [None, "float", "base64"]:
        extra = {} if encoding is None else {"encoding_format": encoding}
        answer = client.embeddings.create(model="smollm2", input=texts, **extra)
        got = [item.embedding for item in answer.data]
        if encoding == "base64":
            got = [struct.unpack("<%df" % (len(base64.b64decode(g)) // 4), base64.b64decode(g))
                   for g in got]
        assert len(got) == len(expected), (encoding, len(got))
        for g, e in zip(got, expected):
            assert as_f32(g) == e, (encoding, list(g[:4]), e[:4])
        assert answer.usage.prompt_tokens > 0
    try:
        client.embeddings.create(model="smollm2", input=texts[0], dimensions=8)
        raise AssertionError("dimensions 8 was accepted")
    except openai.BadRequestError as error:
        assert "dimensions" in str(error), error
    print("all checks passed")


if __name__ == "__main__":
    main()
