"""The signature envelope as the .proto documents it, checkable from the bytes that travel."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from plancache import UntrustedPlan
from plancache.trust.signing import ENVELOPE_VERSION_1, Signer, TrustPolicy, key_id
from plancache.v1 import plancache_pb2 as pb


def metadata() -> pb.PlanMetadata:
    blob = b"blob"
    return pb.PlanMetadata(
        key="k" * 64 + "/sm_90/cudnn-91900/fe-1.32.0/opt-0123456789abcdef",
        blob_sha256=hashlib.sha256(blob).hexdigest(),
        plan_name="eng0",
        candidates=[pb.CandidateTiming(index=0, median_ms=0.25)],
    )


def test_the_documented_envelope_verifies_with_the_raw_public_key() -> None:
    private = Ed25519PrivateKey.generate()
    signature = Signer(private).sign(metadata())
    signed = pb.PlanMetadata.FromString(signature.signed_metadata)
    envelope = "\n".join(
        [
            "plancache/plan-signature/v2",
            signed.key,
            signed.blob_sha256,
            hashlib.sha256(signature.signed_metadata).hexdigest(),
        ]
    )
    private.public_key().verify(
        signature.signature, envelope.encode()
    )  # raises if the documented form is not what is signed
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert signature.key_id == hashlib.sha256(raw).hexdigest()[:16] == key_id(private.public_key())


def test_a_plan_signed_before_v2_still_verifies_in_python() -> None:
    private = Ed25519PrivateKey.generate()
    meta = metadata()
    digest = hashlib.sha256(meta.SerializeToString(deterministic=True)).hexdigest()
    legacy = b"\n".join([ENVELOPE_VERSION_1, meta.key.encode(), meta.blob_sha256.encode(), digest.encode()])
    signature = pb.PlanSignature(key_id=key_id(private.public_key()), signature=private.sign(legacy))
    trust = TrustPolicy({signature.key_id: private.public_key()})
    trust.check(meta, signature)
    meta.plan_name = "eng1"
    with pytest.raises(UntrustedPlan, match="does not verify"):
        trust.check(meta, signature)


def test_signed_metadata_that_does_not_parse_is_refused() -> None:
    private = Ed25519PrivateKey.generate()
    signature = Signer(private).sign(metadata())
    signature.signed_metadata = b"\xff\xff\xff"
    with pytest.raises(UntrustedPlan, match="does not parse"):
        TrustPolicy({signature.key_id: private.public_key()}).check(metadata(), signature)
