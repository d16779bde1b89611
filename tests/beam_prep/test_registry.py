"""The op registry: declarations checked while a chain runs, twins bound to args."""

import numpy as np
import pytest

from beam_prep import ExampleError, Feature, register_op
from beam_prep.features import FeatureError
from beam_prep.ops import registry


def test_temporary_ops_do_not_leak():
  with registry.temporary_ops():

    @register_op("leaky_op")
    def leaky_op():
      return lambda ex: ex

    assert "leaky_op" in registry.registered_ops()
  assert "leaky_op" not in registry.registered_ops()


def test_an_undeclared_array_stops_the_chain_naming_op_and_key():
  with registry.temporary_ops():

    @register_op("sneaky")
    def sneaky():
      def fn(ex):
        return dict(ex, edge_map=np.zeros((2, 2), np.uint8))

      return fn

    chain = registry.build_chain("sneaky")
    with pytest.raises(FeatureError, match="op 'sneaky' adds the array 'edge_map'"):
      chain({"image": np.zeros((2, 2, 3), np.uint8)})


def test_an_undeclared_change_of_a_feature_stops_the_chain():
  with registry.temporary_ops():

    @register_op("quiet_cap")
    def quiet_cap():
      def fn(ex):
        return dict(ex, distance_maps=np.minimum(ex["distance_maps"], 9))

      return fn

    chain = registry.build_chain("quiet_cap")
    with pytest.raises(FeatureError, match="op 'quiet_cap' changes 'distance_maps'"):
      chain({"distance_maps": np.full((2, 2, 2), 50, np.uint8)})


def test_declared_and_intermediate_keys_pass_and_example_errors_are_failures():
  with registry.temporary_ops():

    @register_op(
      "tidy",
      produces={"score": Feature("float32", shape=(), role="metadata")},
      intermediate=("scratch",),
    )
    def tidy():
      def fn(ex):
        if ex.get("bad"):
          raise ExampleError("bad_input", "flagged")
        return dict(ex, score=np.float32(1), scratch=np.zeros(3))

      return fn

    chain = registry.build_chain("tidy")
    outs, failures = chain({"x": 1})
    assert outs[0]["score"] == 1 and not failures
    outs, failures = chain({"bad": True})
    assert not outs and failures[0].reason == "bad_input" and failures[0].stage == "tidy"


def test_twins_get_the_ops_chain_arguments_and_bad_signatures_are_named():
  with registry.temporary_ops():

    def twin(ex, k=1):
      return dict(ex, y=ex["x"] * k)

    @register_op("scaled", produces={"y": Feature("int64", shape=(), role="metadata")}, twin=twin)
    def scaled(k=1):
      return lambda ex: dict(ex, y=ex["x"] * k)

    assert registry.build_twin(registry.parse_chain("scaled(k=3)")[0])({"x": 2})["y"] == 6
    assert registry.build_twin(registry.parse_chain("scaled(4)")[0])({"x": 2})["y"] == 8
    with pytest.raises(ValueError, match="does not accept"):
      registry.build_twin(registry.parse_chain("scaled(k=1, j=2)")[0])
  with pytest.raises(FeatureError, match="must be a beam_prep.Feature"):
    register_op("bad_decl", produces={"y": "uint8"})


def test_ops_and_model_modules_are_found_by_one_rule(tmp_path, monkeypatch):
  """`--ops-module` and `--model-module` look in the current folder as `python -m`
  does; a missing module is an ImportError naming the option and the folders."""
  import sys  # pylint: disable=g-import-not-at-top
  from train.models import import_model_modules  # pylint: disable=g-import-not-at-top

  (tmp_path / "my_plugin_ops.py").write_text("LOADED = True\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  registry.import_ops_modules("my_plugin_ops")
  assert sys.modules["my_plugin_ops"].LOADED
  assert import_model_modules("my_plugin_ops") == {
    "my_plugin_ops": str(tmp_path / "my_plugin_ops.py")
  }
  for importer, what in (
    (registry.import_ops_modules, "ops module"),
    (import_model_modules, "model module"),
  ):
    with pytest.raises(ImportError, match=f"{what} 'no_such_plugin' not found .*{tmp_path}"):
      importer("no_such_plugin")
  sys.modules.pop("my_plugin_ops")
