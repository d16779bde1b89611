"""A simulated annotator: a person's browser on the page of a running
`beam-train serve`, clicking as the field's protocol clicks.

Each object is labelled through the page's own endpoints (`/page/upload`,
`/page/segment` with the previous mask, `/page/save`), as the page calls
them: the next click is the protocol's (`train.evaluate.clicker.next_click_of`: in
the larger error, from the true mask) until the mask reaches TARGET_IOU or
MAX_CLICKS clicks, and what is saved is the model's mask at that moment,
not the truth. The data engine's benchmark and the demo use it.
"""

import base64
import io
import json
import time
from typing import Any, Dict, List

import numpy as np

from beam_prep import keys
from train.evaluate import protocol

TARGET_IOU = 0.90
MAX_CLICKS = protocol.NOC_MAX_CLICKS


class Annotator:
  """A person's browser on a server's page: uploads, clicks, saves."""

  def __init__(self, url: str, save: bool):
    self.url, self.save = url, save
    self.latencies: List[tuple] = []  # (start time, milliseconds) of each click

  def _post(self, path: str, body=None, upload: bytes = b""):
    """POSTs JSON (or one file as a multipart upload); the JSON answer."""
    import urllib.error  # pylint: disable=g-import-not-at-top
    import urllib.request  # pylint: disable=g-import-not-at-top

    if upload:
      data = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="image.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + upload + b"\r\n--b--\r\n"
      )
      kind = "multipart/form-data; boundary=b"
    else:
      data, kind = json.dumps(body).encode("utf-8"), "application/json"
    req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": kind})
    try:
      with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())
    except urllib.error.HTTPError as e:
      raise RuntimeError(f"{path}: {e.code} {e.read()[:300]!r}") from None

  def label_image(self, image: np.ndarray, objects: List[Dict[str, Any]]) -> List[Dict]:
    """Labels each object of one image in turn; saves the image's objects."""
    from beam_prep.drawing import png  # pylint: disable=g-import-not-at-top

    key = self._post("/page/upload", upload=png(image))["id"]
    results, saved = [], []
    for obj in objects:
      result, kept = self._label_object(key, obj["label"])
      results.append(result)
      if kept is not None:
        saved.append(kept)
        if self.save:
          self._post("/page/save", {"id": key, "objects": saved})
    return results

  def _label_object(self, key: str, label: np.ndarray):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from train.evaluate import clicker  # pylint: disable=g-import-not-at-top
    from train.serve.page import DEFAULT_LEVEL  # pylint: disable=g-import-not-at-top

    pos, neg, prob, ious, version = [], [], None, [], None
    pred = np.zeros(label.shape, bool)
    while len(ious) < MAX_CLICKS:
      xy, kind = clicker.next_click_of(pred, label, pos, neg)
      if xy is None:
        break
      (pos if kind == clicker.POSITIVE else neg).append(list(xy))
      if not pos:
        break  # An object with no pixel: nothing to click on.
      t = time.time()
      out = self._post(
        "/page/segment", {"id": key, "positive": pos, "negative": neg, "previous": prob}
      )
      self.latencies.append((t, 1000 * (time.time() - t)))
      prob, version = out["probabilities"], out["version"]
      pred = _levels(prob) >= DEFAULT_LEVEL
      ious.append(float(clicker.label_iou(tf.constant(pred[None]), tf.constant(label[None]))[0]))
      if ious[-1] >= TARGET_IOU:
        break
    clicks = len(ious) if ious and ious[-1] >= TARGET_IOU else MAX_CLICKS
    kept = (
      {"probabilities": prob, "positive": pos, "negative": neg, "version": version}
      if prob is not None and pred.any()
      else None
    )
    return {
      "clicks": clicks,
      "iou_at_1": ious[0] if ious else 0.0,
      "label_iou": ious[-1] if ious else 0.0,
      "version": version,
    }, kept


def _levels(data_url: str) -> np.ndarray:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  return np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


def label_batch(annotator: Annotator, batch: List[Dict[str, Any]]) -> List[Dict]:
  """Each object of the batch labelled, image by image, in order."""
  results, i = [], 0
  while i < len(batch):
    j = i
    while j < len(batch) and batch[j]["image_id"] == batch[i]["image_id"]:
      j += 1
    results += annotator.label_image(batch[i]["image"], batch[i:j])
    i = j
  return results


def source_objects(prep_dir: str) -> List[Dict[str, Any]]:
  """Every object of a prep output's source records (its eval images at their
  own size), in a fixed order (image id, object id): {image_id, object_id,
  image, label (uint8: 1 object, 0 background, 255 ignore)}."""
  from beam_prep.prep_output import PrepOutput  # pylint: disable=g-import-not-at-top
  from train.evaluate.source_eval import object_labels, source_images  # pylint: disable=g-import-not-at-top

  found = []
  for record in source_images(PrepOutput(prep_dir)):
    ids, labels, _ = object_labels(record[keys.INSTANCE_MASK])
    for oid, label in zip(ids, labels):
      found.append(
        {
          "image_id": record[keys.IMAGE_ID],
          "object_id": int(oid),
          "image": record[keys.IMAGE],
          "label": label,
        }
      )
  return sorted(found, key=lambda o: (o["image_id"], o["object_id"]))


def clicks_per_object(results: List[Dict[str, Any]]) -> float:
  """The mean clicks of labelled objects (`Annotator` results)."""
  return float(np.mean([r["clicks"] for r in results])) if results else float("nan")
