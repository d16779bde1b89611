"""The page as an annotation tool: probabilities as levels, the labels kept
as beam-prep reads them (instance PNG, COCO RLE) and read back by its
layouts, the page's endpoints without click state, and one browser session
that labels two objects, undoes and redoes, zooms, loses its image id, and
hands the saved folder to `beam-prep segmentation` (folders and coco)."""

import base64
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from beam_prep import keys, readers
from beam_prep.layouts import coco, folders
from beam_prep.ops.image import decode_file, mask_to_ids
from beam_prep.prep_output import PrepOutput
from tests import helpers
from tests.helpers import png, run_cli
from train.evaluate import protocol
from train.serve import app as serve_app
from train.serve import exports, page
from train.serve.store import Labels
from train.serve.config import ServeConfig

H, W = 96, 128  # Not square: a transposed mask or RLE would show.


def _two_objects():
  """An image with two clear objects: a red disk, a blue box (and their masks)."""
  yy, xx = np.mgrid[:H, :W]
  disk = (xx - 36) ** 2 + (yy - 48) ** 2 <= 20**2
  box = (xx >= 78) & (xx < 114) & (yy >= 24) & (yy < 72)
  image = np.full((H, W, 3), 90, np.uint8)
  image[disk], image[box] = (220, 40, 30), (30, 60, 220)
  return image, disk, box


def _decoded(data_url: str) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


def _data_url(array: np.ndarray) -> str:
  return "data:image/png;base64," + base64.b64encode(png(array)).decode("ascii")


def _item(image, name, data=b""):
  return {"image": image, "name": name, "data": data, "digest": exports.digest(image)}


def test_levels_are_the_served_mask_at_the_default_level_and_threshold_elsewhere():
  rng = np.random.default_rng(0)
  prob = rng.random((50, 60)).astype(np.float32)
  prob.flat[:4] = [
    protocol.PRED_THR,
    np.nextafter(np.float32(protocol.PRED_THR), np.float32(1)),
    0,
    1,
  ]
  mask = prob > np.float32(protocol.PRED_THR)  # As the serving graph compares.
  levels = page.probability_levels(prob, mask)
  assert page.DEFAULT_LEVEL == 49 and levels.dtype == np.uint8 and levels.max() < page.LEVELS
  np.testing.assert_array_equal(levels >= page.DEFAULT_LEVEL, mask)
  for level in (1, 10, 30, 70, 99):
    np.testing.assert_array_equal(levels >= level, prob.astype(np.float64) > level / page.LEVELS)


def _layout_masks(root):
  """{image file name: instance mask} as each layout reads DIR (no Beam job:
  the layouts' own pointer, materialize and decode steps)."""
  folder_masks, coco_masks = {}, {}
  layout = folders.Folders()
  for name in sorted(os.listdir(os.path.join(root, folders.IMAGES_DIR))):
    ex = layout.materialize(layout.pointer(str(root), os.path.join(root, folders.IMAGES_DIR, name)))
    folder_masks[f"{folders.IMAGES_DIR}/{name}"] = mask_to_ids(
      Image.open(io.BytesIO(ex["mask_bytes"]))
    )
  with open(os.path.join(root, exports.COCO_FILE), "rb") as f:
    entries = list(coco.iter_entries(f))  # The coco layout's streaming reader.
  images = [v for k, v in entries if k == "images"]
  anns = [v for k, v in entries if k == "annotations"]
  assert ("categories", [exports.CATEGORY]) in entries
  for image in images:
    mine = [
      dict(a, where="test")
      for a in sorted(anns, key=lambda a: a["id"])
      if a["image_id"] == image["id"]
    ]
    mask, errors = coco.instance_mask(dict(image, annotations=mine), image["file_name"])
    assert errors == []
    coco_masks[image["file_name"]] = mask
  return folder_masks, coco_masks


def test_saved_labels_are_read_back_by_the_folders_and_coco_layouts(tmp_path):
  image, disk, box = _two_objects()
  small = np.zeros((H, W), bool)
  small[40:50, 30:40] = True  # On the disk: painted over it, as the coco layout paints.
  labels = Labels(str(tmp_path))
  clicks = {"positive": [[36, 48]], "negative": []}
  out = labels.save(
    _item(image, "photos/two things.PNG", png(image)),
    [{"mask": m, "clicks": clicks} for m in (disk, small, box)],
  )
  assert out["file_name"] == "images/photos_two_things.png" and out["hidden"] == []
  instance = np.asarray(Image.open(io.BytesIO(out["instance"])))
  want = np.zeros((H, W), np.uint8)
  want[disk], want[small], want[box] = 1, 2, 3
  np.testing.assert_array_equal(instance, want)
  # Another image of the same name gets its own files; no object removes an image.
  other = image[::-1].copy()
  second = labels.save(_item(other, "photos/two things.PNG"), [{"mask": box, "clicks": clicks}])
  assert second["file_name"] == "images/photos_two_things-2.png"
  third = np.zeros_like(image)
  labels.save(_item(third, "gone.png"), [{"mask": disk, "clicks": clicks}])
  assert labels.save(_item(third, "gone.png"), [])["file_name"] is None
  assert sorted(os.listdir(tmp_path / folders.MASKS_DIR)) == [
    "photos_two_things-2.png",
    "photos_two_things.png",
  ]
  labels.flush()
  folder_masks, coco_masks = _layout_masks(tmp_path)
  assert sorted(folder_masks) == sorted(coco_masks) == sorted(labels.saved())
  for name, mask in folder_masks.items():
    np.testing.assert_array_equal(mask, coco_masks[name])
  np.testing.assert_array_equal(folder_masks["images/photos_two_things.png"], want)
  np.testing.assert_array_equal(decode_file(open(tmp_path / out["file_name"], "rb").read()), image)
  assert readers.resolve_layout(str(tmp_path), "auto").name == "folders"
  assert readers.resolve_layout(str(tmp_path / exports.COCO_FILE), "auto").name == "coco"
  # A server started again on the folder knows the images by their pixels, clicks and all.
  again = Labels(str(tmp_path))
  assert again.document() == labels.document()
  entry = again.find(exports.digest(image))
  assert entry["file_name"] == out["file_name"] and entry["annotations"][0]["clicks"] == clicks
  np.testing.assert_array_equal(exports.object_mask(entry["annotations"][1]), small)
  hidden = again.save(
    _item(image, "x"),
    [
      {"mask": small, "clicks": clicks},
      {"mask": disk, "clicks": clicks},
      {"mask": disk & ~small, "clicks": clicks},
    ],
  )
  assert hidden["hidden"] == [2]  # Objects 1 and 3 cover it: the page says so.
  with pytest.raises(ValueError, match="at most 254"):
    exports.instance_mask([disk] * 255)
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / exports.COCO_FILE).write_text("[1, 2]")
  with pytest.raises(ValueError, match="--save-dir .*instances.json"):
    Labels(str(tmp_path / "bad"))


@pytest.fixture(scope="module")
def labelled(trained, trained_versions, prep_dir, tmp_path_factory):
  """A test client of a server saving into a folder: (client, save dir)."""
  save = str(tmp_path_factory.mktemp("labels"))
  config = ServeConfig(model=trained, save_dir=save, data=prep_dir)
  app = serve_app.make_app(
    config, trained_versions, page.Sources("", prep_dir, config.max_eval_objects)
  )
  yield app.test_client(), save
  app.extensions[serve_app.LABELS].close()


def _upload(client, image, name):
  r = client.post(
    "/page/upload",
    data={"file": (io.BytesIO(png(image)), name)},
    content_type="multipart/form-data",
  )
  assert r.status_code == 200, r.get_json()
  return r.get_json()


def test_the_server_keeps_no_click_state_and_saves_what_it_is_sent(labelled, trained_served):
  client, save = labelled
  model = trained_served
  image, _, _ = _two_objects()
  opened = _upload(client, image, "two.png")
  assert opened["objects"] == [] and opened["saved_as"] is None
  body = {"id": opened["id"], "positive": [[36, 48]], "negative": []}
  one = client.post("/page/segment", json=body).get_json()
  levels = _decoded(one["probabilities"])
  direct = model.segment(image, [[36, 48]], [])
  np.testing.assert_array_equal(levels >= page.DEFAULT_LEVEL, direct["mask"] > 0)
  two = dict(
    body, positive=[[36, 48], [30, 44]], negative=[[5, 5]], previous=one["probabilities"], level=40
  )
  answer = client.post("/page/segment", json=two).get_json()
  want = model.segment(image, two["positive"], two["negative"], (levels >= 40).astype(np.uint8))
  np.testing.assert_array_equal(
    _decoded(answer["probabilities"]),
    page.probability_levels(want["probabilities"], want["mask"] > 0),
  )
  assert client.post("/page/segment", json=two).get_json() == answer  # Same state, same answer.
  for bad, field in (
    ({"level": 0}, "level"),
    ({"level": 100}, "level"),
    ({"previous": "data:image/png;base64,AAAA"}, "previous"),
    ({"previous": _data_url(np.zeros((4, 4), np.uint8))}, "previous"),
  ):
    r = client.post("/page/segment", json=dict(two, **bad))
    assert r.status_code == 400 and r.get_json()["error"].startswith(field), r.get_json()
  objects = [
    {
      "probabilities": answer["probabilities"],
      "level": 40,
      "positive": two["positive"],
      "negative": two["negative"],
    },
    {"probabilities": one["probabilities"], "level": 49, "positive": [[96, 48]]},
  ]
  saved = client.post("/page/save", json={"id": opened["id"], "objects": objects}).get_json()
  assert saved["saved"] and saved["file_name"] == "images/two.png"
  np.testing.assert_array_equal(
    _decoded(saved["instance"]),
    np.asarray(Image.open(os.path.join(save, folders.MASKS_DIR, "two.png"))),
  )
  assert open(os.path.join(save, "images", "two.png"), "rb").read() == png(image)
  Labels(save).close()  # Another process's view: the document written.
  with open(os.path.join(save, exports.COCO_FILE)) as f:
    assert client.get("/page/coco").get_json() == json.load(f)
  # The same pixels opened again (another name): the saved objects come back.
  again = _upload(client, image, "copy.png")
  assert again["saved_as"] == "images/two.png" and len(again["objects"]) == 2
  assert again["objects"][0]["positive"] == two["positive"]
  np.testing.assert_array_equal(
    _decoded(again["objects"][0]["probabilities"]) >= 1, _decoded(answer["probabilities"]) >= 40
  )
  assert client.get("/page/sources").get_json()["saved"] == ["images/two.png"]
  assert client.post("/page/open", json={"saved": "images/two.png"}).get_json()["saved_as"]
  r = client.post("/page/open", json={"saved": "../../etc/passwd"})
  assert r.status_code == 404 and "saved" in r.get_json()["error"]
  empty = dict(objects[0], level=99)
  r = client.post("/page/save", json={"id": opened["id"], "objects": [empty]})
  assert r.status_code == 400 and "objects[0].probabilities" in r.get_json()["error"]
  r = client.post(
    "/page/save", json={"id": opened["id"], "objects": [dict(objects[0], positive="x")]}
  )
  assert r.status_code == 400 and "objects[0].positive" in r.get_json()["error"]
  r = client.post("/page/save", json={"id": opened["id"], "objects": [dict(objects[0], level=0)]})
  assert r.status_code == 400 and r.get_json()["error"].startswith("objects[0].level")
  assert client.get(f"/page/truth/{opened['id']}.png").status_code == 404  # No true mask.


def test_a_box_prompt_is_served_by_serve_box_and_a_bad_box_is_a_400(labelled, trained_served):
  client, _ = labelled
  model = trained_served
  image, _, _ = _two_objects()
  opened = _upload(client, image, "two.png")
  body = {"id": opened["id"], "positive": [], "box": [74, 20, 117, 75]}
  one = client.post("/page/segment", json=body).get_json()
  want = model.segment(image, [], [], box=body["box"])
  np.testing.assert_array_equal(_decoded(one["mask"]) > 0, want["mask"] > 0)
  assert not want["mask"][:, 118:].any() and not want["mask"][:20].any()
  two = dict(body, negative=[[90, 40]], previous=one["probabilities"])
  answer = client.post("/page/segment", json=two).get_json()
  previous = (_decoded(one["probabilities"]) >= page.DEFAULT_LEVEL).astype(np.uint8)
  again = model.segment(image, [], [[90, 40]], previous, box=body["box"])
  np.testing.assert_array_equal(_decoded(answer["mask"]) > 0, again["mask"] > 0)
  for bad in ([1, 2, 3], [0, 0, 5, "x"], [5, 5, 1, 1], "box", [True, 0, 1, 1]):
    r = client.post("/page/segment", json=dict(body, box=bad))
    assert r.status_code == 400 and r.get_json()["error"].startswith("box:"), (bad, r.get_json())
  r = client.post("/page/segment", json=dict(body, box=None))  # No box and no click.
  assert r.status_code == 400 and r.get_json()["error"].startswith("positive:")  # The page's name.


def test_an_eval_object_gives_its_true_mask_and_the_iou_at_any_level(labelled):
  client, _ = labelled
  ev = client.post("/page/open", json={"eval": 0}).get_json()
  truth = np.asarray(Image.open(io.BytesIO(client.get(f"/page/truth/{ev['id']}.png").data)))
  assert set(np.unique(truth)) <= {0, 1, keys.IGNORE} and (truth == 1).any()
  seg = client.post("/page/segment", json={"id": ev["id"], "positive": [[10, 10]]}).get_json()
  iou = client.post(
    "/page/iou",
    json={"id": ev["id"], "probabilities": seg["probabilities"], "level": page.DEFAULT_LEVEL},
  ).get_json()
  assert iou == {"iou": seg["iou"], "pixels": seg["pixels"]}
  r = client.post(
    "/page/iou", json={"id": ev["id"], "probabilities": seg["probabilities"], "level": 20}
  ).get_json()
  levels = _decoded(seg["probabilities"])
  assert r["pixels"] == int((levels >= 20).sum()) and 0 <= r["iou"] <= 1


# ---- one browser session ------------------------------------------------------

JS_DRAFT = "return labelPage.current().draft"
JS_STEPS = "return labelPage.page.history.length"
# The mask canvas's pixels, summed with their positions (equal canvases, equal sums).
JS_CANVAS = (
  "const c = document.getElementById('mask');"
  "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
  "let s = 0; for (let i = 0; i < d.length; i++) s = (s * 31 + d[i]) % 1000000007;"
  "return s;"
)


class _Session:
  """The browser on the page: clicks in image pixels, keys, waits."""

  def __init__(self, browser, width, height):
    from selenium.webdriver.support.ui import WebDriverWait  # pylint: disable=g-import-not-at-top

    self.b, self.w, self.h = browser, width, height
    self.wait = WebDriverWait(browser, 60, poll_frequency=helpers.POLL_SECONDS).until

  def js(self, script):
    return self.b.execute_script(script)

  def click(self, x, y, right=False):
    """A click at pixel (x, y) of the image, however zoomed and panned (at
    the point of the window the pixel's centre is shown at)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder  # pylint: disable=g-import-not-at-top

    box = self.js("return document.getElementById('clicks').getBoundingClientRect().toJSON()")
    steps, chain = self.js(JS_STEPS), ActionBuilder(self.b)
    chain.pointer_action.move_to_location(
      round(box["left"] + (x + 0.5) * box["width"] / self.w),
      round(box["top"] + (y + 0.5) * box["height"] / self.h),
    )
    (chain.pointer_action.context_click() if right else chain.pointer_action.click())
    chain.perform()
    self.wait(lambda b: self.js(JS_STEPS) > steps)
    return self.js(JS_DRAFT)

  def drag_box(self, x0, y0, x1, y1):
    """A shift-drag from pixel (x0, y0) to (x1, y1) of the image: a box prompt."""
    from selenium.webdriver.common.action_chains import ActionChains  # pylint: disable=g-import-not-at-top
    from selenium.webdriver.common.keys import Keys  # pylint: disable=g-import-not-at-top

    canvas = self.b.find_element("id", "clicks")
    box = self.js("return document.getElementById('clicks').getBoundingClientRect().toJSON()")

    def offset(x, y):  # From the canvas's centre, where Selenium's offsets start.
      return (
        round((x + 0.5) * box["width"] / self.w - box["width"] / 2),
        round((y + 0.5) * box["height"] / self.h - box["height"] / 2),
      )

    steps = self.js(JS_STEPS)
    chain = ActionChains(self.b).key_down(Keys.SHIFT)
    chain.move_to_element_with_offset(canvas, *offset(x0, y0)).click_and_hold()
    chain.move_to_element_with_offset(canvas, *offset((x0 + x1) // 2, (y0 + y1) // 2))
    chain.move_to_element_with_offset(canvas, *offset(x1, y1)).release().key_up(Keys.SHIFT)
    chain.perform()
    self.wait(lambda b: self.js(JS_STEPS) > steps)
    return self.js(JS_DRAFT)

  def key(self, key, ctrl=False):
    from selenium.webdriver.common.action_chains import ActionChains  # pylint: disable=g-import-not-at-top
    from selenium.webdriver.common.keys import Keys  # pylint: disable=g-import-not-at-top

    chain = ActionChains(self.b)
    if ctrl:
      chain = chain.key_down(Keys.CONTROL)
    chain = chain.send_keys(key)
    (chain.key_up(Keys.CONTROL) if ctrl else chain).perform()
    self.idle()

  def idle(self):
    """Waits until the page's queue of actions has run."""
    self.js("window.__idle = false; labelPage.page.queue.then(() => { window.__idle = true; });")
    self.wait(lambda b: self.js("return window.__idle"))

  def saved(self, n):
    self.idle()
    note = self.b.find_element("id", "saved-note").text
    assert note.startswith(f"{n} object") and "saved as" in note, note


def _label_two_objects(s):
  """Object 1 by three clicks, undo and redo; object 2 under zoom after a pan."""
  s.click(36, 48)
  after_two = s.click(30, 44), s.js(JS_CANVAS)
  after_three = s.click(5, 5, right=True), s.js(JS_CANVAS)
  assert [(c["x"], c["y"], c["positive"]) for c in after_three[0]["clicks"]] == [
    (36, 48, True),
    (30, 44, True),
    (5, 5, False),
  ]
  s.key("z", ctrl=True)  # Undo: the earlier state itself, nothing predicted again.
  assert (s.js(JS_DRAFT), s.js(JS_CANVAS)) == after_two
  s.key("y")
  assert (s.js(JS_DRAFT), s.js(JS_CANVAS)) == after_three
  s.key("u")
  s.key("z", ctrl=False)  # Not a shortcut: nothing happens.
  assert s.js(JS_DRAFT) == after_two[0]
  s.key("y")
  s.key("n")
  s.saved(1)
  from selenium.webdriver.common.action_chains import ActionChains  # pylint: disable=g-import-not-at-top

  stage = s.b.find_element("id", "stage")
  fit = stage.rect["width"]
  s.key("+")
  s.key("+")
  before, steps = stage.rect, s.js(JS_STEPS)
  assert before["width"] == pytest.approx(fit * 1.25**2, abs=1)
  chain = ActionChains(s.b).move_to_element(stage).click_and_hold()
  chain.move_by_offset(-60, 25).release().perform()
  s.idle()
  moved = stage.rect
  assert s.js(JS_STEPS) == steps  # A pan is no click.
  assert (moved["x"] - before["x"], moved["y"] - before["y"]) == (-60, 25)
  assert [c["x"] for c in s.click(96, 48)["clicks"]] == [96]  # Source pixels under zoom.
  s.key("0")
  s.key("n")
  s.saved(2)


def _box_prompt(s, served, image):
  """A shift-drag around the blue box: a box prompt, the served `serve_box`
  mask; a reset drops it (no object saved)."""
  steps = s.js(JS_STEPS)
  draft = s.drag_box(74, 20, 117, 75)
  assert draft["clicks"] == [] and draft["box"] == pytest.approx([74, 20, 117, 75], abs=1)
  want = served.segment(image, [], [], box=draft["box"])["mask"] > 0
  level = s.js("return labelPage.current().level")
  np.testing.assert_array_equal(_decoded(draft["prob"]) >= level, want)
  assert s.js(JS_STEPS) == steps + 1  # One action: the drag is no click.
  assert len(s.b.find_element("id", "marks").find_elements("css selector", "rect")) == 1
  s.key("r")
  assert s.js(JS_DRAFT) is None
  s.saved(2)


def _true_outline_is_shown(s, prep_dir):
  """An eval object of --data: the true mask's outline, where the true mask is."""
  from selenium.webdriver.support.ui import Select  # pylint: disable=g-import-not-at-top
  from train.evaluate.noc import eval_objects  # pylint: disable=g-import-not-at-top

  Select(s.b.find_element("id", "evals")).select_by_index(1)
  s.wait(lambda b: s.js("return labelPage.page.truth && labelPage.page.at === 0"))
  s.idle()
  shown = (
    np.array(
      s.js(
        "const c = document.getElementById('truth');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "return Array.from(d.filter((_, i) => i % 4 === 3));"
      )
    ).reshape(s.js("return [labelPage.page.height, labelPage.page.width]"))
    > 0
  )
  _, labels, _ = eval_objects(PrepOutput(prep_dir), 1)
  inside = np.pad(labels[0] == 1, 1)
  core = (
    inside[1:-1, 1:-1] & inside[:-2, 1:-1] & inside[2:, 1:-1] & inside[1:-1, :-2] & inside[1:-1, 2:]
  )
  np.testing.assert_array_equal(shown, (labels[0] == 1) & ~core)
  s.key("t")
  assert not s.b.find_element("id", "truth").is_displayed()


def test_labelling_two_objects_in_the_browser_saves_what_beam_prep_reads_back(
  trained, trained_served, prep_dir, tmp_path
):
  image, _, _ = _two_objects()
  picture = tmp_path / "two.png"
  picture.write_bytes(png(image))
  save = tmp_path / "labels"
  # A cache of one image: another upload pushes the page's image out.
  config = ServeConfig(model=trained, port=0, save_dir=str(save), cache_mb=0.06, data=prep_dir)
  with serve_app.running(config) as (server, _):
    browser = helpers.browser()
    try:
      browser.get(f"http://127.0.0.1:{server.port}/")
      s = _Session(browser, W, H)
      s.wait(
        lambda b: s.js("return document.getElementById('model').textContent") != "click and see"
      )
      browser.find_element("id", "upload").send_keys(str(picture))
      s.wait(lambda b: s.js("return labelPage.page.at") == 0)
      _label_two_objects(s)
      _box_prompt(s, trained_served, image)
      # The server loses the image: the page sends its copy again and goes on.
      _upload_over_http(f"http://127.0.0.1:{server.port}", image[::-1].copy())
      lost = s.js("return labelPage.page.id")
      browser.find_elements("css selector", "#objects li")[1].click()  # Edit object 2.
      s.idle()
      s.click(100, 30)
      s.key("n")
      s.saved(2)
      assert s.js("return labelPage.page.id") != lost
      assert "error" not in browser.find_element("id", "status").get_attribute("class")
      objects = s.js("return labelPage.current().objects")
      areas = [
        int(li.text.split(": ")[1].split()[0])
        for li in browser.find_elements("css selector", "#objects li")
      ]
      # The same file chosen again opens again: the saved objects come back.
      browser.find_element("id", "upload").send_keys(str(picture))
      s.wait(
        lambda b: (
          s.js("return labelPage.page.at") == 0
          and len(s.js("return labelPage.current().objects")) == 2
        )
      )
      reopened = s.js("return labelPage.current().objects")
      _true_outline_is_shown(s, prep_dir)
    finally:
      browser.quit()
  masks = [_decoded(o["prob"]) >= o["level"] for o in objects]
  assert areas == [int(m.sum()) for m in masks] and [o["clicks"][-1]["x"] for o in objects] == [
    5,
    100,
  ]
  for o, m in zip(reopened, masks):
    np.testing.assert_array_equal(_decoded(o["prob"]) >= o["level"], m)
  saved = np.asarray(Image.open(save / folders.MASKS_DIR / "two.png"))
  np.testing.assert_array_equal(saved, exports.instance_mask(masks))
  assert set(np.unique(saved)) == {0, 1, 2}, "an object is painted over: the coco layout drops it"
  assert (save / "images" / "two.png").read_bytes() == picture.read_bytes()
  _beam_prep_reads_back(save, saved)


def _upload_over_http(url, image):
  import urllib.request  # pylint: disable=g-import-not-at-top

  body = (
    b'--b\r\nContent-Disposition: form-data; name="file"; filename="other.png"\r\n'
    b"Content-Type: image/png\r\n\r\n" + png(image) + b"\r\n--b--\r\n"
  )
  req = urllib.request.Request(
    url + "/page/upload", data=body, headers={"Content-Type": "multipart/form-data; boundary=b"}
  )
  with urllib.request.urlopen(req, timeout=60) as r:
    assert r.status == 200


def _beam_prep_reads_back(save, saved):
  """The saved folder as the folders layout reads it (`_layout_masks`; a Beam
  job over a label store's folder: the engine's rounds), and `beam-prep
  segmentation` over its COCO file: the eval image at its own size holds the
  page's instance mask."""
  from train.evaluate.source_eval import source_images  # pylint: disable=g-import-not-at-top

  (folder_mask,) = _layout_masks(str(save))[0].values()
  np.testing.assert_array_equal(folder_mask, saved)
  out = save.parent / "prep_coco"
  argv = ["segmentation", "--input", str(save / exports.COCO_FILE), "--layout", "coco"]
  argv += ["--output", str(out), "--image-size", "32", "--variants", "1"]
  assert run_cli(argv + ["--eval-percent", "100", "--progress-seconds", "0"]) == 0
  (got,) = list(source_images(PrepOutput(str(out))))
  np.testing.assert_array_equal(got["instance_mask"], saved)
