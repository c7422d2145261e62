"""The report's opening sentences are computed from the saved numbers (synthetic
inputs for both outcomes), and a report prints only what a run recorded."""

import re

import numpy as np

from rankjax._src import report, report_figures, report_story as story, tour
from rankjax._src.config import TrainConfig, TransformerConfig
from rankjax._src.train import diagnostics_postnorm
from rankjax._src.train.run_reader import Run

STEPS = np.array([1, 10, 20, 30, 40])


def _tsim(collapsed_from: dict[int, int], layers: int = 6) -> np.ndarray:
  """(5, layers) similarities: 0.5, or 0.99 from row ``collapsed_from[l]`` on."""
  sim = np.full((len(STEPS), layers), 0.5)
  for layer, row in collapsed_from.items():
    sim[row:, layer] = 0.99
  return sim


def _numbers(tsim, **kw) -> story.RunNumbers:
  base = dict(name="lm_post", model="transformer", placement="post", layers=tsim.shape[1],
              updates=40, final_loss=3.24, steps=STEPS, tsim=tsim)
  return story.RunNumbers(**{**base, **kw})


def test_collapse_is_the_first_update_from_which_layers_stay_collapsed():
  sim = _tsim({3: 2, 4: 2, 5: 2, 2: 3})
  sim[1, 0] = 0.99                     # layer 0 was high once and fell back: not collapsed
  assert story.collapse(STEPS, sim) == story.Collapse(20, (3, 4, 5), (2, 3, 4, 5))
  assert story.collapse(STEPS, _tsim({})) is None
  assert story.COLLAPSED_SIM == diagnostics_postnorm.ALARM_SIM_MIN
  assert story.layer_ranges([0, 2, 3, 5]) == "layers 0, 2-3, 5"
  assert story.layer_ranges([4]) == "layer 4"


def test_sentences_of_a_collapsed_run_come_from_its_numbers():
  r = _numbers(_tsim({3: 2, 4: 2, 5: 2, 2: 3}), freq_loss=3.25,
               grad_norm=np.array([1e-7, 1e-3, 1e-2, 0.1, 0.5, 1.0]))
  text = " ".join(story.run_sentences(r))
  assert text.startswith("lm_post (Post-Norm, 6 layers) trained 40 updates to a loss of "
                         "3.240 nats per target (frequency loss 3.250).")
  assert ("It collapsed at update 20: from then to the last diagnostics update (40) the token "
          "similarity of layers 3-5 stayed at or above 0.95, and by the end that of layers "
          "2-5.") in text
  assert "layer 0's parameter-gradient norm was 1e-07 times layer 5's" in text
  # other numbers, other sentences
  later = " ".join(story.run_sentences(_numbers(_tsim({5: 4}))))
  assert "collapsed at update 40" in later and "similarity of layer 5 stayed" in later
  assert "frequency loss" not in later and "gradient" not in later   # not recorded


def test_a_run_that_stopped_itself_says_where_and_why():
  why = "collapsed: token similarity >= 0.95 in layers 3, 4 at the last 2 diagnostics steps"
  r = _numbers(_tsim({3: 2, 4: 2}), updates=31, stopped={"step": 31, "reason": why})
  text = " ".join(story.run_sentences(r))
  assert f"It stopped itself at update 31 (stop_on_collapse): {why}." in text
  assert "stopped itself" not in " ".join(story.run_sentences(_numbers(_tsim({3: 2}))))
  assert story.numbers_from_dict(story.numbers_to_dict(r)).stopped == r.stopped


def test_sentences_of_a_run_that_did_not_collapse_say_so_with_its_highest_layer():
  sim = _tsim({})
  sim[-1, 4] = 0.8
  sim[2, 1] = 0.97                      # passed the threshold once, fell back
  text = " ".join(story.run_sentences(_numbers(sim, name="lm_pre", placement="pre")))
  assert "lm_pre (Pre-Norm, 6 layers)" in text
  assert ("It did not collapse: no layer's token similarity stayed at or above 0.95 to the "
          "end (at update 40 the highest was 0.800, in layer 4).") in text
  assert "collapsed at" not in text


def test_smoke_tour_says_its_size_is_too_small_and_the_full_tour_does_not():
  smoke = story.smoke_sentence(tour.lm_configs(smoke=True))
  assert "smoke tour" in smoke and "too small to show the effect" in smoke
  assert "4 layers of width 32 trained 12 updates" in smoke and "12 layers of width 64" in smoke
  assert story.smoke_sentence(tour.lm_configs()) is None
  assert story.smoke_sentence({"lm_post": tour.lm_configs(smoke=True)["lm_post"]}) is None


def test_jacobian_and_study_sentences():
  jac = {"studies": {"pre": {"erank": [0.9, 0.47]}, "post": {"erank": [0.8, 0.14]},
                     "none": {"erank": [0.7, 0.13]}},
         "configs": {"pre": {"depth": 2, "width": 64}}, "num_seeds": 4}
  assert story.jacobian_sentence(jac) == (
      "Residual MLPs at initialization (depth 2, width 64, 4 weight draws): "
      "erank(dh_L/dh_0)/d is 0.470 for Pre-Norm, 0.140 for Post-Norm, 0.130 for no norm.")
  rows = [{"experiment": "fig1", "status": "match", "scale": "quick"},
          {"experiment": "fig2", "status": "mismatch", "scale": "quick"},
          {"experiment": "fig2", "status": "mismatch", "scale": "quick"},
          {"experiment": "fig9", "status": "failed", "scale": "quick"}]
  assert story.study_sentence("tr", rows) == (
      "tr (quick scale): 4 paper items, 1 match, 2 mismatch, 1 failed; mismatch: fig2; "
      "failed: fig9.")


# ---------------------------------------------------------------------------
# whole pages from synthetic saved runs (load_run replaced; nothing is trained)

LAYERS = 4


def _run(tmp_path, name, position, diagnostics):
  cfg = TrainConfig(seq_len=32, diag_every=10, diagnostics=diagnostics,
                    model=TransformerConfig(num_layers=LAYERS, d_model=32, num_heads=2,
                                            d_ff=64, max_seq_len=32, norm_position=position))
  rng = np.random.default_rng(0)
  n = len(STEPS)
  diag = {"basic/tsim_y2": rng.uniform(0, 0.6, (n, LAYERS)),
          "basic/grad_norm": rng.uniform(0.1, 1, (n, LAYERS))}
  if "postnorm" in diagnostics:
    diag.update({"postnorm/freq_loss": np.full(n, 3.25),
                 "postnorm/contraction_2": rng.uniform(0.5, 2, (n, LAYERS)),
                 "postnorm/rms_factor_mean_2": rng.uniform(0.5, 1, (n, LAYERS))})
  if "attention" in diagnostics:
    for key in ("theta_cert", "entropy_norm"):
      for p in ("p5", "p50", "p95"):
        diag[f"attention/{key}_{p}"] = rng.uniform(0, 1, (n, 3))
    diag["attention/layers"] = np.tile([0, 2, 3], (n, 1))
  history = [{"step": s, "loss": 4.0 - s / 20} for s in range(1, 41)]
  folder = tmp_path / name
  folder.mkdir()
  (folder / "config.json").write_text("{}")
  return Run(workdir=folder, config=cfg, step=40, params={}, diagnostics=diag,
             diagnostic_steps=STEPS, metrics={}, history=history)


def _page(tmp_path, monkeypatch, runs):
  from rankjax._src.train import run_reader
  monkeypatch.setattr(run_reader, "load_run", lambda path: runs[path.name])
  page = report.build_report(tmp_path).read_text()
  return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)


def test_a_report_never_prints_what_was_not_recorded(tmp_path, monkeypatch):
  runs = {"lm": _run(tmp_path, "lm", "pre", ("basic",))}
  page = _page(tmp_path, monkeypatch, runs)
  assert "nan" not in page.lower()
  assert "<td>not recorded</td>" in page                       # the frequency loss cell
  assert "Not recorded in lm: the frequency loss and the contraction bound" in page
  assert "--set diagnostics=basic,postnorm,attention" in page
  assert "dashed" not in page                                  # no dashed line is drawn
  assert "the frequency loss was not recorded" in page
  assert page.index("class='summary'") < page.index("<table>")  # the story comes first
  assert "lm (Pre-Norm, 4 layers) trained 40 updates to a loss of 2.000" in page


def test_figures_number_layers_from_0_with_integer_ticks_and_say_what_they_show(
    tmp_path, monkeypatch):
  drawn = {}
  real_save = report_figures._save

  def save(fig, out, name, tight=True):
    fig.canvas.draw()
    drawn[name] = [(ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), list(ax.get_xticks()),
                    list(ax.get_yticks()), [line.get_xdata() for line in ax.get_lines()],
                    [(c.get_array().shape, c.get_coordinates()) for c in ax.collections
                     if hasattr(c, "get_coordinates")])
                   for ax in fig.axes]
    return real_save(fig, out, name, tight)

  monkeypatch.setattr(report_figures, "_save", save)
  diags = ("basic", "postnorm", "attention")
  runs = {n: _run(tmp_path, n, p, diags) for n, p in (("lm_post", "post"), ("lm_pre", "pre"))}
  page = _page(tmp_path, monkeypatch, runs)
  assert "Layers are numbered from 0 (the first layer)" in page
  assert "dashed line is the frequency loss" in page
  for title, xlabel, ylabel, xticks, yticks, xdata, meshes in drawn["grad_profile"]:
    assert title.startswith("gradient norm per layer\nlm_p")
    assert xlabel.startswith("layer") and all(float(t).is_integer() for t in xticks)
    for x in xdata:
      np.testing.assert_array_equal(x, np.arange(LAYERS))     # layer 0 = TensorBoard layer_00
  sim_axes = [a for a in drawn["token_similarity"] if a[2].startswith("layer")]
  assert len(sim_axes) == 2
  for _, _, _, _, yticks, _, meshes in sim_axes:
    assert all(float(t).is_integer() for t in yticks)
    (shape, coords), = meshes
    assert coords[0, 0, 1] == -0.5 and coords[-1, 0, 1] == LAYERS - 0.5   # rows 0 .. L-1
    np.testing.assert_allclose(coords[0, :, 0], [0, 5.5, 15, 25, 35, 45])  # around updates
  assert "layer 3" in " ".join(a[0] for a in drawn["attention"])   # the layer it shows
  jac = {"studies": {"pre": {"erank": [0.9, 0.8, 0.7], "order_profile": [0.5, 0.3, 0.2]}}}
  report_figures.fig_jacobian(jac, tmp_path)
  (_, xlabel, _, xticks, _, (x,), _), (_, _, _, kticks, _, (k,), _) = drawn["jacobian"]
  assert xlabel.startswith("depth l") and all(float(t).is_integer() for t in xticks + kticks)
  np.testing.assert_array_equal(x, [1, 2, 3])          # erank of dh_l/dh_0, l = 1 .. L
  np.testing.assert_array_equal(k, [0, 1, 2])          # path orders k = 0 .. L


# ---------------------------------------------------------------------------
# a plug-in model's placement, every recorded diagnostic, throughput


def _register_resmlp(monkeypatch, name, norm_position):
  """A plug-in Post-LN residual MLP (it ignores ``model.norm_position``: its config is
  an ``MLPConfig`` of kind ``name``) whose task declares ``norm_position`` (None:
  declares nothing)."""
  import flax.linen as nn
  import jax.numpy as jnp

  from rankjax._src import config as config_lib
  from rankjax._src.config import MLPConfig
  from rankjax._src.train import tasks

  monkeypatch.setitem(config_lib.MODEL_CONFIGS, name, type(f"{name}_config", (MLPConfig,), {}))

  class PostLNResMLP(nn.Module):
    width: int
    depth: int
    num_classes: int

    @nn.compact
    def __call__(self, x):
      x = nn.Dense(self.width)(x)
      for _ in range(self.depth):
        x = nn.LayerNorm()(x + nn.relu(nn.Dense(self.width)(x)))
      return nn.Dense(self.num_classes)(x)

  def factory(cfg):
    mlp = cfg.model
    spec = {"inputs": ((mlp.input_dim,), jnp.float32), "targets": ((), jnp.int32)}
    return tasks.ClassifierTask(name, "images", PostLNResMLP(mlp.width, mlp.depth,
                                                            mlp.num_classes),
                                spec, 1, (), norm_position=norm_position,
                                unannotated_params="fallback")   # nn.Dense: no axes

  monkeypatch.setitem(tasks.TASKS, name, factory)


def _plugin_run(tmp_path, name, history):
  from rankjax._src import config as config_lib
  model = config_lib.MODEL_CONFIGS[name](depth=3, width=8, input_dim=8, num_classes=3)
  cfg = TrainConfig(model=model, diag_every=10, diagnostics=("basic", "logit_margin"))
  assert cfg.model.norm_position == "pre"            # the field the plug-in ignores
  rng = np.random.default_rng(0)
  n = len(STEPS)
  diag = {"basic/batch_similarity_stream": rng.uniform(0, 1, (n, 3)),
          "basic/grad_norm": rng.uniform(0.1, 1, (n, 3)),
          "logit_margin/margin": rng.uniform(0, 1, n)}
  folder = tmp_path / name
  folder.mkdir()
  (folder / "config.json").write_text("{}")
  return Run(workdir=folder, config=cfg, step=40, params={}, diagnostics=diag,
             diagnostic_steps=STEPS, metrics={}, history=history)


def test_a_plugin_models_placement_is_what_its_task_declares(tmp_path, monkeypatch):
  _register_resmlp(monkeypatch, "resmlp_post", "post")
  _register_resmlp(monkeypatch, "resmlp_anon", None)
  history = [{"step": s, "loss": 1.0} for s in range(1, 41)]
  runs = {n: _plugin_run(tmp_path, n, history) for n in ("resmlp_post", "resmlp_anon")}
  page = _page(tmp_path, monkeypatch, runs)
  assert "resmlp_post (Post-Norm, 3 blocks) trained 40 updates" in page
  assert "resmlp_anon (norm placement not declared by the plug-in, 3 blocks)" in page
  assert "Pre-Norm" not in page and "pre-norm" not in page
  assert story.placement_of(_run(tmp_path, "lm", "post", ()).config) == "post"
  # the library's models: the norms they build, overrides included
  lm = TransformerConfig(norm_position="pre", r_norm="rms")
  assert story.placement_of(TrainConfig(model=lm)) == "P+R"
  assert story.placement_name("P+R") == "norms at P+R"


def test_every_recorded_diagnostic_is_in_the_report(tmp_path, monkeypatch):
  """Series without a figure of their own (the MLP's batch similarity, a plug-in's
  diagnostic) are drawn in the generic figure and listed with their last values."""
  _register_resmlp(monkeypatch, "resmlp_post", "post")
  runs = {"resmlp_post": _plugin_run(tmp_path, "resmlp_post", [{"step": 1, "loss": 1.0}])}
  shown = report_figures.shown_in(runs)
  assert shown == {"basic/batch_similarity_stream": "diagnostics",
                   "basic/grad_norm": "grad_profile", "logit_margin/margin": "diagnostics"}
  assert report_figures.undrawn(runs) == ["logit_margin/margin",     # a plug-in's first
                                          "basic/batch_similarity_stream"]
  page = _page(tmp_path, monkeypatch, runs)
  for key, where in shown.items():
    assert f"<td>{key}</td>" in page and f"<td>figure {where}</td>" in page
  assert "Recorded diagnostics that no figure above draws" in page
  assert (tmp_path / "report" / "diagnostics.png").is_file()
  margin = runs["resmlp_post"].diagnostics["logit_margin/margin"][-1]
  assert f"<td>{story.last_values(np.array([margin]))}</td>" in page
  assert story.last_values(np.array([[1.0, np.nan, 2.0, 3.0, 4.0, 5.0]])) == (
      "min 1, mean 3, max 5 over 6 (1 non-finite)")
  assert story.last_values(np.array([[0.5], [0.25]])) == "0.25"


def test_report_throughput_excludes_compile_steps_and_counts_images(tmp_path, monkeypatch):
  _register_resmlp(monkeypatch, "resmlp_post", "post")
  history = [{"step": 1, "loss": 1.0, "images_per_s": 30.0, "compile_step": 1.0},
             {"step": 2, "loss": 1.0, "images_per_s": 1000.0, "images_per_s_avg": 1000.0}]
  runs = {"resmlp_post": _plugin_run(tmp_path, "resmlp_post", history),
          "lm": _run(tmp_path, "lm", "pre", ("basic",))}
  runs["lm"].history[-1]["tokens_per_s_avg"] = 294.9
  page = _page(tmp_path, monkeypatch, runs)
  assert "throughput (last log window, excluding compile steps)" in page
  assert "<td>1000 images/s</td>" in page and "<td>294.9 tokens/s</td>" in page
  assert story.throughput(history, "images") == (1000.0, "images/s")
  assert story.throughput([{"step": 4, "tokens_per_s_avg": 50.0}], "images") is None
  assert story.throughput([{"step": 1}], "tokens") is None


def test_a_plugin_lms_table_shows_the_numbers_its_sentences_quote(tmp_path, monkeypatch):
  """A plug-in LM (kind other than "transformer") had "n/a (LM runs)" in the table's
  frequency-loss and token-similarity cells beside sentences quoting both."""
  import dataclasses

  from rankjax._src import config as config_lib
  from rankjax._src.train import tasks
  cls = type("my_lm_config", (TransformerConfig,), {})
  monkeypatch.setitem(config_lib.MODEL_CONFIGS, "my_lm", cls)
  monkeypatch.setitem(tasks.TASKS, "my_lm",
                      lambda cfg: dataclasses.replace(tasks.TASKS["transformer"](cfg),
                                                      kind="my_lm"))
  run = _run(tmp_path, "mine", "post", ("basic", "postnorm"))
  run.config = dataclasses.replace(
      run.config, model=cls(**{f.name: getattr(run.config.model, f.name)
                               for f in dataclasses.fields(TransformerConfig)}))
  assert run.config.model.kind == "my_lm"
  page = _page(tmp_path, monkeypatch, {"mine": run})
  assert "n/a (LM runs)" not in page
  last = run.diagnostics["basic/tsim_y2"][-1]
  assert f"the highest was {last.max():.3f}, in layer {last.argmax()}" in page
  assert f"<td>{last[-1]:.3f}</td>" in page and "<td>3.250</td>" in page


def test_a_diagnostic_of_sampled_layers_is_labelled_by_those_layers(tmp_path, monkeypatch):
  """The attention diagnostic of a 4-layer LM measures layers 0, 2, 3: the generic
  figure labelled its columns [0] [1] [2] ("[i] is column i") and the table gave no
  layers; both now name the layers measured."""
  run = _run(tmp_path, "lm", "post", ("basic", "attention"))
  run.diagnostics["attention/p_max_p50"] = np.random.default_rng(1).uniform(0, 1, (5, 3))
  labels = {}
  real_save = report_figures._save

  def save(fig, out, name, tight=True):
    labels[name] = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    return real_save(fig, out, name, tight)

  monkeypatch.setattr(report_figures, "_save", save)
  np.testing.assert_array_equal(report_figures.layers_of(run, "attention/p_max_p50"),
                                [0, 2, 3])
  assert report_figures.layers_of(run, "basic/tsim_y2") is None      # column i: layer i
  page = _page(tmp_path, monkeypatch, {"lm": run})
  assert labels["diagnostics"] == ["lm layer 0", "lm layer 2", "lm layer 3"]
  assert "<td>attention/p_max_p50</td><td>3 values (layers 0, 2, 3)</td>" in page
  assert "<td>basic/tsim_y2</td><td>4 values</td>" in page
