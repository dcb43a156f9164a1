"""Specs: the one grammar and the one option validator of attentions, feature maps, the registry's build and the
LM's layer+map variants."""

from __future__ import annotations

import pytest

import attnbench
from attnbench.api import registry
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.api.options import check_options
from attnbench.api.spec import Spec, label_of, parse_spec, parse_specs, split_spec


def test_spec_parses_options_with_types_and_round_trips():
    s = parse_spec("nala:lam=2:sign_split=true")
    assert s.name == "nala" and s.options == {"lam": 2.0, "sign_split": True} and s.kind == "attention"
    assert isinstance(s.options["lam"], float)  # int accepted where the default is a float
    assert parse_spec(s.label) == s
    assert [x.label for x in parse_specs("softmax, nala:lam=3")] == ["softmax", "nala:lam=3.0"]


@pytest.mark.parametrize("text, match", [
    ("nalla", "did you mean 'nala'"),
    ("nala:lamb=2", r"unknown option\(s\) 'lamb' \(did you mean 'lam'\?\); it accepts: lam="),
    ("nala:lam=big", "lam='big' must be a float"),
    ("nala:sign_split=1", "sign_split=1 must be a bool"),
    ("nala:lam", "is not key=value"),
    ("nala:lam=1:lam=2", "given twice"),
    (":lam=1", "empty name"),
    (",", "names no attention"),
    ("", "names no attention"),
    ("nala,nala", "more than once"),
    ("nala:lam=2,nala:lam=2.0", "nala:lam=2.0 more than once"),
])
def test_bad_specs_fail_with_a_message_naming_what_is_wrong(text, match):
    with pytest.raises(AttnbenchError, match=match) as e:
        parse_specs(text)
    assert "\n" not in str(e.value)


def test_spec_values_the_mechanism_refuses_fail_at_the_trial_build():
    spec = parse_spec("laplacian:landmarks=0")
    with pytest.raises(AttnbenchError, match="--attn laplacian:landmarks=0"):
        spec.check_builds(heads=2, head_dim=8, seq_len=16)


def test_preset_options_are_defaults_the_command_line_overrides():
    s = parse_spec("performer:features=16").with_defaults({"features": 128})
    assert s.options == {"features": 16}
    assert parse_spec("performer").with_defaults({"features": 128}).options == {"features": 128}
    with pytest.raises(AttnbenchError, match="'featurs'"):  # a preset's bad option is caught too
        parse_spec("performer").with_defaults({"featurs": 128})


def test_a_feature_map_is_a_spec_of_the_same_type_validated_by_the_same_rules():
    fm = parse_spec("nala:lam=3", kind="feature map")
    assert fm == Spec("nala", {"lam": 3.0}, "feature map") and fm.label == "nala:lam=3.0"
    assert fm.build(heads=2, head_dim=8).__class__ is registry.get_feature_map("nala")
    with pytest.raises(UnknownNameError, match="unknown feature map 'nalla'.*did you mean 'nala'"):
        parse_spec("nalla", kind="feature map")
    with pytest.raises(AttnbenchError, match=r"feature map 'nala' got unknown option\(s\) 'lamb'"):
        parse_spec("nala:lamb=1", kind="feature map")
    with pytest.raises(ValueError, match="kind must be one of"):
        Spec.make("nala", kind="layer")


def test_the_registry_validates_build_options_with_the_spec_validator():
    with pytest.raises(AttnbenchError, match=r"attention 'nala' got unknown option\(s\) 'lamda' \(did you mean"):
        attnbench.build("nala", heads=2, head_dim=8, lamda=3)
    with pytest.raises(AttnbenchError, match="attention 'nala': option lam='x' must be a float"):
        attnbench.build("nala", heads=2, head_dim=8, lam="x")
    with pytest.raises(AttnbenchError, match=r"feature map 'nala' got unknown option\(s\) 'lamda'"):
        registry.build_feature_map("nala", heads=2, head_dim=8, lamda=3)
    a = attnbench.build("nala", heads=2, head_dim=8, lam=3)  # an int where the default is a float: made a float
    b = Spec.parse("nala:lam=3").build(heads=2, head_dim=8)
    assert type(a) is type(b)


def test_the_grammar_and_the_validator_are_shared_pieces():
    assert split_spec("deltanet+nala:qk_norm=k:lam=2", what="variant") == ("deltanet+nala", {"qk_norm": "k", "lam": 2})
    assert split_spec("x:a=true:b=none:c=1.5:d=s") == ("x", {"a": True, "b": None, "c": 1.5, "d": "s"})
    assert label_of("x", {"b": 1, "a": 2.0}) == "x:a=2.0:b=1"
    assert check_options("thing 'x'", {"a": 1}, {"a": 0.5, "b": None}) == {"a": 1.0}
    with pytest.raises(AttnbenchError, match=r"thing 'x' got unknown option\(s\) 'c'; it accepts: a=0.5, b=None"):
        check_options("thing 'x'", {"c": 1}, {"a": 0.5, "b": None})


# --- the LM's variants: a layer with its model options and a feature-map spec ------------------------------------
def test_lm_variants_are_a_layer_and_a_feature_map_spec_with_the_committed_labels():
    import json
    from pathlib import Path

    from attnbench.suites.lm.config import parse_variants

    v, = parse_variants("gated_deltanet+nala:qk_norm=k:lam=2:key_width=match")
    assert v.layer == "gated_deltanet" and v.map == Spec("nala", {"lam": 2.0}, "feature map")
    assert v.model_options == (("key_width", "match"), ("qk_norm", "k"))
    assert v.label == "gated_deltanet+nala:key_width=match:qk_norm=k:lam=2.0" and parse_variants(v.label) == [v]
    assert parse_variants("deltanet")[0].map == Spec("silu", {}, "feature map")
    # every trained variant of the committed results parses back to its recorded label and options (the cells' identity)
    records = [json.loads(line) for f in sorted((Path(__file__).parents[1] / "results" / "lm").glob("*.jsonl"))
               for line in f.read_text().splitlines() if line.strip()]
    records = [r for r in records if r["task"] == "pretrain"]  # lm-eval records name the checkpoint's variant
    assert records
    for r in records:
        v, = parse_variants(r["attention"])
        assert (v.label, v.options()) == (r["attention"], r["options"])


@pytest.mark.parametrize("text, match", [
    ("deltanett", "unknown layer 'deltanett'; did you mean 'deltanet'"),
    ("deltanet+nalla", r"--attn 'deltanet\+nalla': unknown feature map 'nalla'; did you mean 'nala'"),
    ("gated_deltanet:qk_nrm=k", r"unknown option\(s\) 'qk_nrm' \(did you mean 'qk_norm'\?\)"),
    ("deltanet:use_gate=1", "use_gate=1 must be a bool"),
    ("deltanet+nala:lam=x", "lam='x' must be a float"),
    ("deltanet:qk_norm", "is not key=value"),
    ("deltanet,,nala", "an empty variant"),
    ("deltanet,deltanet", "given twice: deltanet"),
])
def test_bad_lm_variants_fail_with_one_line(text, match):
    from attnbench.suites.lm.config import parse_variants

    with pytest.raises(AttnbenchError, match=match) as e:
        parse_variants(text)
    assert "\n" not in str(e.value)


def test_the_committed_results_keep_their_labels_and_options():
    """A record's attention label and options are part of its point's identity: parsing them back must give the
    same spec, or a store would re-run its cells and the committed results would detach from their runs."""
    import json
    from pathlib import Path

    root = Path(__file__).parents[1] / "results"
    n = 0
    for suite in ("lra", "vision", "adala", "scaling", "claims", "mixa"):
        for f in sorted((root / suite).glob("*.jsonl")):
            for r in (json.loads(line) for line in f.read_text().splitlines() if line.strip()):
                if suite in ("lra", "vision", "adala"):  # the label of the command line's spec
                    assert parse_spec(r["attention"]).label == r["attention"]
                elif suite in ("scaling", "claims"):  # the name and the spec's options
                    s = Spec.make(r["attention"], r["options"])
                    assert (s.name, dict(s.options)) == (r["attention"], r["options"])
                else:  # mixa: one spec per layer
                    assert [parse_spec(t).label for t in r["params"]["specs"]] == r["params"]["specs"]
                n += 1
    assert n > 0
