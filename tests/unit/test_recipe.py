"""Recipes: validation, error messages, overrides, and every shipped recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune_cli.pipelines.recipes import load_any, load_recipe
from finetune_cli.recipe import PACKAGED_RECIPES, Recipe, RecipeError, apply_overrides


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_defaults_and_types():
    r = load_recipe(None)
    assert isinstance(r, Recipe) and r.objective.name == "ce" and r.train.lr == 2e-5
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        r.train.lr = 1.0  # frozen


def test_unknown_key_names_key_file_and_closest(tmp_path):
    p = write(tmp_path, "train:\n  lrr: 0.1\n")
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    assert str(e.value) == f"unknown key `train.lrr` in {p}; did you mean `train.lr`?"


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown key `trian` in .*did you mean `train`"):
        load_recipe(write(tmp_path, "trian: {}\n"))


def test_wrong_type_and_range(tmp_path):
    with pytest.raises(RecipeError, match=r"`train.batch_size` in .* must be an integer, got 'big'"):
        load_recipe(None, ["train.batch_size=big"])
    with pytest.raises(RecipeError, match=r"`train.batch_size` .* must be > 0; got 0"):
        load_recipe(None, ["train.batch_size=0"])
    with pytest.raises(RecipeError, match=r"`model.pooling` .* must be one of cls, mean, pooler; got 'max'"):
        load_recipe(None, ["model.pooling=max"])
    with pytest.raises(RecipeError, match=r"`train.warmup_ratio` .* must be <= 1"):
        load_recipe(None, ["train.warmup_ratio=2"])
    with pytest.raises(RecipeError, match="must be true or false"):
        load_recipe(None, ["data.group_by_length=maybe"])


def test_float_literals_without_dot_are_accepted():
    assert load_recipe(None, ["train.lr=1e-3"]).train.lr == 1e-3


def test_malformed_yaml_names_line(tmp_path):
    p = write(tmp_path, "train:\n  lr: [1, 2\nmodel: {}\n")
    with pytest.raises(RecipeError, match=rf"malformed YAML in {p}:\d+:\d+"):
        load_recipe(p)
    with pytest.raises(RecipeError, match="must be a YAML mapping at top level"):
        load_recipe(write(tmp_path, "- a\n- b\n"))


def test_missing_file_suggests_packaged_recipe(tmp_path):
    with pytest.raises(RecipeError, match=r"recipe file not found: quikstart; did you mean `quickstart`"):
        load_recipe("quikstart")


def test_unknown_objective_and_param():
    with pytest.raises(RecipeError, match=r"unknown objective `cee`; did you mean `ce`"):
        load_recipe(None, ["objective.name=cee"])
    with pytest.raises(RecipeError, match=r"unknown key `objective.label_smothing` .*did you mean `objective.label_smoothing`"):
        load_recipe(None, ["objective.label_smothing=0.1"])
    with pytest.raises(RecipeError, match=r"invalid `objective` .*label_smoothing must be < 1"):
        load_recipe(None, ["objective.label_smoothing=1.5"])


def test_overrides_set_and_remove(tmp_path):
    p = write(tmp_path, "train:\n  lr: 0.1\n  epochs: 2\ndata:\n  columns: {text: sentence}\n")
    r = load_recipe(p, ["train.lr=3e-5", "~train.epochs", "data.columns.text_pair=s2", "objective.label_smoothing=0.1"])
    assert r.train.lr == 3e-5 and r.train.epochs == 3.0  # removed -> default
    assert r.data.columns.text == "sentence" and r.data.columns.text_pair == "s2"
    assert r.objective.params == {"label_smoothing": 0.1}
    with pytest.raises(RecipeError, match="must look like key=value"):
        load_recipe(p, ["train.lr"])


def test_apply_overrides_does_not_mutate_input():
    tree = {"a": {"b": 1}}
    out = apply_overrides(tree, ["a.c=2", "~a.b"])
    assert tree == {"a": {"b": 1}} and out == {"a": {"c": 2}}


def test_exclusive_data_sources():
    with pytest.raises(RecipeError, match="exclusive"):
        load_recipe(None, ["data.dataset=glue:sst2", "data.train=x.tsv"])


def test_yaml_round_trip_and_fingerprint(tmp_path):
    r = load_recipe("quickstart", ["train.seed=7"])
    p = write(tmp_path, r.to_yaml())
    r2 = load_recipe(p)
    assert r2.to_dict() == r.to_dict() and r2.fingerprint() == r.fingerprint()
    assert load_recipe("quickstart", ["train.seed=8"]).fingerprint() != r.fingerprint()
    assert load_recipe("quickstart", ["output.dir=elsewhere"]).fingerprint() == load_recipe("quickstart").fingerprint()


SHIPPED = sorted(PACKAGED_RECIPES.rglob("*.yaml"))


def test_shipped_recipes_found():
    assert {p.stem for p in SHIPPED} >= {"quickstart", "ce"}
    # the top-level recipes/ folder users browse is the packaged set, file for file
    top = Path(__file__).parents[2] / "recipes"
    assert sorted(p.relative_to(top) for p in top.rglob("*.yaml")) == [p.relative_to(PACKAGED_RECIPES) for p in SHIPPED]
    for p in SHIPPED:
        assert (top / p.relative_to(PACKAGED_RECIPES)).read_text() == p.read_text(), p.name


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_recipe_validates(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# "), f"{path.name} must start with a one-line description comment"
    load_any(path)


def test_metric_is_checked_at_validation_and_defaults_to_the_objectives_first():
    """`train.metric` is refused before anything trains when the objective's evaluation does not
    compute it; left out, it is the objective's first metric."""
    with pytest.raises(RecipeError, match=r"`train.metric`.*`acc`.*did you mean `accuracy`"):
        load_recipe("quickstart", ["train.metric=acc"])
    with pytest.raises(RecipeError, match=r"`train.metric`.*`accuracy`.*`simcse_unsup`"):
        load_recipe("simcse_unsup", ["train.metric=accuracy"])
    assert load_recipe("quickstart", ["~train.metric"]).train.metric == "accuracy"
    assert load_recipe("simcse_unsup", ["~train.metric"]).train.metric == "spearman"


def test_recipe_layer_parses_without_objective_knowledge():
    """The schema layer takes any objective name and parameters; the full load checks them."""
    from finetune_cli.recipe import parse_recipe

    r = parse_recipe(None, ["objective.name=nosuch", "objective.tau=3"])
    assert (r.objective.name, dict(r.objective.params)) == ("nosuch", {"tau": 3})
    with pytest.raises(RecipeError, match="unknown objective `nosuch`"):
        load_recipe(None, ["objective.name=nosuch"])
