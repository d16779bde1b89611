"""The label store: labels shared by processes and threads, none lost when
two processes save at once or one dies mid-save; a save dir from before the
store imported; an object saved again unchanged keeps its version."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from beam_prep.layouts import folders
from tests.helpers import png
from train.serve import exports
from train.serve.store import DB_FILE, PENDING_PREFIX, Labels

H, W = 40, 56
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _image(seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 255, (H, W, 3), dtype=np.uint8)


def _item(seed: int, name: str = ""):
  image = _image(seed)
  return {
    "image": image,
    "name": name or f"photo{seed}.png",
    "data": png(image),
    "digest": exports.digest(image),
  }


def _mask(seed: int) -> np.ndarray:
  mask = np.zeros((H, W), bool)
  mask[seed % 20 : seed % 20 + 10, 5:30] = True
  return mask


def _objects(seed: int, n: int = 1):
  return [
    {"mask": _mask(seed + i), "clicks": {"positive": [[10, seed % 20 + 2]], "negative": []}}
    for i in range(n)
  ]


# Saves images [first, first + count) into DIR, from a process of its own.
_SAVER = textwrap.dedent("""
    import sys
    from tests.train.test_label_store import _item, _objects
    from train.serve.store import Labels
    save_dir, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    labels = Labels(save_dir)
    for seed in range(first, first + count):
      labels.save(_item(seed), _objects(seed), model_version=seed)
    labels.close()
""")


def _run(script: str, *args) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-c", script, *map(str, args)],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )


def _check_folder(save_dir: str, seeds) -> None:
  """The store, its files and the COCO document hold exactly `seeds`' images."""
  labels = Labels(save_dir)
  try:
    names = sorted(labels.saved())
    assert names == sorted(f"images/photo{s}.png" for s in seeds)
    for seed in seeds:
      entry = labels.find(exports.digest(_image(seed)))
      np.testing.assert_array_equal(exports.object_mask(entry["annotations"][0]), _mask(seed))
      assert entry["annotations"][0][exports.MODEL_VERSION] == seed
      mask_file = os.path.join(save_dir, folders.MASKS_DIR, f"photo{seed}.png")
      assert os.path.exists(mask_file) and os.path.exists(
        os.path.join(save_dir, entry["file_name"])
      )
    assert sorted(os.listdir(os.path.join(save_dir, folders.IMAGES_DIR))) == sorted(
      n.split("/")[1] for n in names
    )
    with open(os.path.join(save_dir, exports.COCO_FILE)) as f:
      assert sorted(i["file_name"] for i in json.load(f)["images"]) == names
  finally:
    labels.close()


def test_two_processes_saving_into_one_folder_lose_no_label(tmp_path):
  save = str(tmp_path / "labels")
  procs = [
    subprocess.Popen(
      [sys.executable, "-c", _SAVER, save, str(first), "12"],
      cwd=REPO,
      stderr=subprocess.PIPE,
      text=True,
    )
    for first in (0, 100)
  ]
  for p in procs:
    assert p.wait(timeout=300) == 0, p.stderr.read()
  _check_folder(save, list(range(12)) + list(range(100, 112)))


def test_threads_of_one_process_lose_no_label(tmp_path):
  labels = Labels(str(tmp_path))
  threads = [
    threading.Thread(
      target=lambda first=first: [
        labels.save(_item(s), _objects(s), model_version=s) for s in range(first, first + 8)
      ]
    )
    for first in (0, 50, 200)
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  labels.close()
  _check_folder(str(tmp_path), list(range(8)) + list(range(50, 58)) + list(range(200, 208)))


# Saves images 0..2, then dies inside the save of image 3 at the step
# named by argv[2]: "before_commit" (its image file written, nothing
# committed) or "after_commit" (committed, its files not yet in place).
_CRASH = textwrap.dedent("""
    import os, sys
    from tests.train.test_label_store import _item, _objects
    from train.serve import store
    labels = store.Labels(sys.argv[1])
    for seed in range(3):
      labels.save(_item(seed), _objects(seed), model_version=seed)
    if sys.argv[2] == "before_commit":
      real = labels._replace_objects
      def die(*args):
        real(*args)
        os._exit(3)
      labels._replace_objects = die
    else:
      labels._finish_pending = lambda *args: os._exit(3)
    labels.save(_item(3), _objects(3), model_version=3)
""")


@pytest.mark.parametrize("when", ["before_commit", "after_commit"])
def test_a_process_dying_in_a_save_loses_no_other_label_and_leaves_no_half(tmp_path, when):
  save = str(tmp_path)
  done = _run(_CRASH, save, when)
  assert done.returncode == 3, done.stderr
  hidden = [
    n for n in os.listdir(os.path.join(save, folders.IMAGES_DIR)) if n.startswith(PENDING_PREFIX)
  ]
  assert hidden == [PENDING_PREFIX + "photo3.png"]
  # The next open finishes a committed save and drops an uncommitted one.
  _check_folder(save, [0, 1, 2, 3] if when == "after_commit" else [0, 1, 2])


def test_a_save_dir_of_an_instances_json_alone_is_imported(tmp_path):
  labels = Labels(str(tmp_path))
  for seed in range(3):
    labels.save(_item(seed), _objects(seed, n=2), model_version=seed)
  labels.close()
  before = Labels(str(tmp_path)).document()
  os.remove(tmp_path / DB_FILE)
  with open(tmp_path / exports.COCO_FILE) as f:
    doc = json.load(f)
  del doc["images"][1][exports.DIGEST]  # Known by its file's pixels then.
  (tmp_path / exports.COCO_FILE).write_text(json.dumps(doc))
  again = Labels(str(tmp_path))
  assert again.document() == before
  assert again.find(exports.digest(_image(1)))["file_name"] == "images/photo1.png"
  again.close()


def test_an_object_saved_again_unchanged_keeps_its_version_and_time(tmp_path):
  labels = Labels(str(tmp_path))
  item = _item(7)
  first = _objects(7, n=1)
  labels.save(item, first, model_version=1)
  (old,) = labels.find(item["digest"])["annotations"]
  labels.save(item, first + _objects(30, n=1), model_version=2)
  kept, new = labels.find(item["digest"])["annotations"]
  assert (kept[exports.MODEL_VERSION], kept[exports.SAVED]) == (1, old[exports.SAVED])
  assert new[exports.MODEL_VERSION] == 2 and new[exports.SAVED] >= old[exports.SAVED]
  labels.save(item, [])
  assert labels.find(item["digest"]) is None and labels.saved() == []
  labels.close()
  assert os.listdir(tmp_path / folders.MASKS_DIR) == []
  assert json.loads((tmp_path / exports.COCO_FILE).read_text())["images"] == []


def test_a_store_file_that_is_no_database_is_refused_naming_it(tmp_path):
  (tmp_path / DB_FILE).write_bytes(os.urandom(100))
  with pytest.raises(ValueError, match=f"{DB_FILE} is no label store .*not a database"):
    Labels(str(tmp_path))
