"""The label store: every label a person saves, in an embedded database that
any number of server processes and threads share without losing one.

With `beam-train serve --save-dir DIR` the labels live in

  DIR/labels.sqlite     the store (SQLite, WAL): the truth
  DIR/images/NAME.EXT   each image: the file's own bytes when it was a file
  DIR/masks/NAME.png    its instance mask (the `folders` layout's coding)
  DIR/instances.json    every image's objects as COCO instances

The files are written from the store, so DIR stays the input of
`beam-prep segmentation --layout folders --input DIR` and of `--layout coco
--input DIR/instances.json`: an image and its mask right after each save,
the COCO document shortly after (a writer thread gathers saves that come
together; `flush()` writes it now, and so does every open and `close()`).
A save touches one image's rows and files, never the whole document, so
it costs the same with ten labels or ten thousand.

Tables (one row per image, one per object; times in seconds since the epoch):

  images   file_name (key), digest (sha1 of the pixels, unique), height,
           width, origin (JSON: who saved it: the page, a tool's task...)
  objects  file_name, number (1..N, the instance id), counts (COCO
           compressed RLE), area, bbox, clicks (JSON {"positive",
           "negative"}), model_version (the served version that made the
           mask), saved (time)
  pending  file operations of committed saves not yet done (see below)
  meta     schema version, change and document generations

Nothing is lost when two processes save at once, or one dies mid-save.
Each save holds an exclusive lock on DIR/.labels.lock (one process at a
time, and a thread lock within it) and runs one SQLite transaction. A new
image's bytes are written first to a hidden file (beam-prep skips hidden
files), and the transaction records what is left to do in `pending`. After
the commit the files are put in place and `pending` is emptied. An open
finishes what a dead process left: its committed saves get their files,
and its uncommitted hidden files are removed. An object saved again
unchanged keeps its time and model version.

Without a save dir the store is an in-memory database: the same labels for
the server's life, no files. A save dir holding only an `instances.json`
(from before the store) is imported on first open.
"""

import contextlib
import fcntl
import json
import os
import posixpath
import sqlite3
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from beam_prep import keys
from beam_prep.drawing import png
from beam_prep.layouts import folders
from train.serve import exports

DB_FILE, LOCK_FILE = "labels.sqlite", ".labels.lock"
SCHEMA_VERSION = 1
# The document writer waits this long after a save for others to join it.
DOCUMENT_DELAY_S = 0.5
PENDING_PREFIX = ".pending-"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
  file_name TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, height INTEGER NOT NULL,
  width INTEGER NOT NULL, origin TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS objects (
  file_name TEXT NOT NULL, number INTEGER NOT NULL, counts TEXT NOT NULL,
  area INTEGER NOT NULL, bbox TEXT NOT NULL, clicks TEXT NOT NULL,
  model_version INTEGER, saved REAL NOT NULL, PRIMARY KEY (file_name, number));
CREATE TABLE IF NOT EXISTS pending (file_name TEXT PRIMARY KEY, op TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
# pending.op: put the image's hidden file in place and write its mask, or
# remove both files.
WRITE, REMOVE = "write", "remove"


def _connect(path: str, schema: bool = True) -> sqlite3.Connection:
  """The store at `path`; a ValueError naming it when it is no SQLite database."""
  try:
    return _connected(path, schema)
  except sqlite3.DatabaseError as e:
    raise ValueError(
      f"{path} is no label store ({e}): move it away, or give another folder"
    ) from None


def _connected(path: str, schema: bool) -> sqlite3.Connection:
  db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
  if path != ":memory:":
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")  # A saved label survives a power cut too.
  if not schema:
    return db
  db.executescript(_SCHEMA)
  db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
  for key in ("generation", "document"):
    db.execute("INSERT OR IGNORE INTO meta VALUES (?, 0)", (key,))
  return db


def _object_row(
  file_name: str, number: int, obj: Dict[str, Any], version: Optional[int], now: float
) -> tuple:
  ann = exports.annotation(obj["mask"], obj["clicks"])
  return (
    file_name,
    number,
    ann["segmentation"]["counts"],
    ann["area"],
    json.dumps(ann["bbox"]),
    json.dumps(ann[exports.CLICKS]),
    obj.get("version", version),
    now,
  )


def _annotation(row: sqlite3.Row, height: int, width: int) -> Dict[str, Any]:
  """A COCO annotation (no id) of an objects row, with our fields."""
  return {
    "category_id": exports.CATEGORY["id"],
    "iscrowd": 0,
    "segmentation": {"size": [height, width], "counts": row["counts"]},
    "area": row["area"],
    "bbox": json.loads(row["bbox"]),
    exports.CLICKS: json.loads(row["clicks"]),
    exports.MODEL_VERSION: row["model_version"],
    exports.SAVED: row["saved"],
  }


def _entry_of(image: sqlite3.Row, objects: List[sqlite3.Row]) -> Dict[str, Any]:
  """An image's entry (COCO image fields, ours, its annotations) from its rows."""
  h, w = image["height"], image["width"]
  return {
    "file_name": image["file_name"],
    "height": h,
    "width": w,
    exports.DIGEST: image["digest"],
    exports.ORIGIN: json.loads(image["origin"]),
    "annotations": [_annotation(o, h, w) for o in objects],
  }


# The COCO document's arrays, built by SQLite (its JSON functions, in C, with
# Python's GIL released: the saves of other threads go on meanwhile). Ids
# are numbered from 1 in the order images were first saved, each image's
# objects in their order. The fields are those `exports.entries_of` reads.
_IMAGE_IDS = "SELECT *, ROW_NUMBER() OVER (ORDER BY rowid) AS id FROM images"
_IMAGES_JSON = f"""
SELECT json_group_array(json_object('file_name', file_name, 'height', height, 'width', width,
  '{exports.DIGEST}', digest, '{exports.ORIGIN}', json(origin), 'id', id))
FROM ({_IMAGE_IDS} ORDER BY id)"""
_ANNOTATIONS_JSON = f"""
SELECT json_group_array(json_object('id', id, 'image_id', image_id,
  'category_id', {exports.CATEGORY["id"]}, 'iscrowd', 0,
  'segmentation', json_object('size', json_array(height, width), 'counts', counts),
  'area', area, 'bbox', json(bbox), '{exports.CLICKS}', json(clicks),
  '{exports.MODEL_VERSION}', model_version, '{exports.SAVED}', saved))
FROM (SELECT o.*, i.height, i.width, i.id AS image_id,
             ROW_NUMBER() OVER (ORDER BY i.id, o.number) AS id
      FROM objects o JOIN ({_IMAGE_IDS}) i USING (file_name) ORDER BY id)"""


def _document_json(db: sqlite3.Connection) -> bytes:
  """The COCO instances document of every saved image, as JSON bytes."""
  images, annotations = (db.execute(q).fetchone()[0] for q in (_IMAGES_JSON, _ANNOTATIONS_JSON))
  parts = {
    "info": json.dumps(exports.INFO),
    "images": images,
    "annotations": annotations,
    "categories": json.dumps([exports.CATEGORY]),
  }
  return ("{" + ", ".join(f'"{k}": {v}' for k, v in parts.items()) + "}").encode("utf-8")


def _snapshot(db: sqlite3.Connection):
  """(generation, document generation, document JSON), read in one transaction."""
  db.execute("BEGIN")
  try:
    generation, written = (
      db.execute(f"SELECT value FROM meta WHERE key = '{k}'").fetchone()[0]
      for k in ("generation", "document")
    )
    return generation, written, _document_json(db)
  finally:
    db.execute("COMMIT")


def _entries(db: sqlite3.Connection) -> List[Dict[str, Any]]:
  """Every image's entry, in the order they were first saved: two queries."""
  objects: Dict[str, List[sqlite3.Row]] = {}
  for row in db.execute("SELECT * FROM objects ORDER BY file_name, number"):
    objects.setdefault(row["file_name"], []).append(row)
  return [
    _entry_of(image, objects.get(image["file_name"], []))
    for image in db.execute("SELECT * FROM images ORDER BY rowid")
  ]


class Labels:
  """The saved images and their objects (see the module docstring).

  Args:
    save_dir: the folder of the store and its files ("": in memory only).

  Raises:
    ValueError: the folder's `instances.json` cannot be imported, or its
      store is of a newer schema, or no SQLite database.
  """

  def __init__(self, save_dir: str = ""):
    self.dir = save_dir
    self._thread_lock = threading.RLock()
    self._changed = threading.Event()
    self._closed = False
    self._writer = None
    self._reader: Optional[sqlite3.Connection] = None
    self._document_lock = threading.Lock()
    if not save_dir:
      self._db = _connect(":memory:")
      self._db.row_factory = sqlite3.Row
      return
    for sub in (folders.IMAGES_DIR, folders.MASKS_DIR):
      os.makedirs(os.path.join(save_dir, sub), exist_ok=True)
    self._lock_file = open(os.path.join(save_dir, LOCK_FILE), "a+b")  # pylint: disable=consider-using-with
    with self._locked():  # Another process may be opening the same folder.
      fresh = not os.path.exists(os.path.join(save_dir, DB_FILE))
      self._db = _connect(os.path.join(save_dir, DB_FILE))
      self._db.row_factory = sqlite3.Row
      self._check_schema()
      if fresh:
        self._import_document()
      self._finish_pending()
      self._remove_orphans()
    self.flush()
    self._writer = threading.Thread(
      target=self._write_documents, daemon=True, name="labels-document"
    )
    self._writer.start()

  # ---- locking -----------------------------------------------------------

  @contextlib.contextmanager
  def _locked(self) -> Iterator[None]:
    """This process's thread lock, and with a save dir the folder's file
    lock: one writer at a time across threads and processes."""
    with self._thread_lock:
      if not self.dir:
        yield
        return
      fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)

  @contextlib.contextmanager
  def _transaction(self) -> Iterator[sqlite3.Connection]:
    self._db.execute("BEGIN IMMEDIATE")
    try:
      yield self._db
    except BaseException:
      self._db.execute("ROLLBACK")
      raise
    self._db.execute("COMMIT")

  def _check_schema(self) -> None:
    version = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
    if version > SCHEMA_VERSION:
      raise ValueError(
        f"--save-dir {self.dir}: {DB_FILE} is of a newer version of beam-prep "
        f"(schema {version}, this one reads {SCHEMA_VERSION})"
      )

  # ---- reading -------------------------------------------------------------

  def _rows(self, sql: str, args: tuple = ()) -> List[sqlite3.Row]:
    with self._thread_lock:
      return self._db.execute(sql, args).fetchall()

  def saved(self) -> List[str]:
    """The file names of the images saved under the save dir ([] without one)."""
    if not self.dir:
      return []
    return [r[0] for r in self._rows("SELECT file_name FROM images ORDER BY rowid")]

  def count(self) -> int:
    """How many images hold saved objects."""
    return self._rows("SELECT COUNT(*) FROM images")[0][0]

  def path(self, file_name: str) -> str:
    """The saved image file of `file_name`, or KeyError."""
    if not self.dir or not self._rows("SELECT 1 FROM images WHERE file_name = ?", (file_name,)):
      raise KeyError(file_name)
    return os.path.join(self.dir, file_name)

  def _entry(self, image: sqlite3.Row) -> Dict[str, Any]:
    objects = self._rows(
      "SELECT * FROM objects WHERE file_name = ? ORDER BY number", (image["file_name"],)
    )
    return _entry_of(image, objects)

  def find(self, pixels: str) -> Optional[Dict[str, Any]]:
    """The entry of the image of these pixels (`exports.digest`), or None."""
    rows = self._rows("SELECT * FROM images WHERE digest = ?", (pixels,))
    return self._entry(rows[0]) if rows else None

  def entries(self) -> List[Dict[str, Any]]:
    """Every saved image's entry, in the order they were first saved."""
    with self._thread_lock:
      return _entries(self._db)

  def document_json(self) -> bytes:
    """The COCO instances document of every saved image, as JSON bytes."""
    with self._thread_lock:
      return _document_json(self._db)

  def document(self) -> Dict[str, Any]:
    """The COCO instances document of every saved image."""
    return json.loads(self.document_json())

  # ---- saving --------------------------------------------------------------

  def save(
    self,
    item: Dict[str, Any],
    objects: List[Dict[str, Any]],
    model_version: Optional[int] = None,
    origin: Optional[Dict[str, Any]] = None,
  ) -> Dict[str, Any]:
    """Keeps (and writes) an image's objects, each {"mask": bool [H, W],
    "clicks": {...}}; no object removes the image.

    Args:
      item: the image: {"image", "digest", "name", "data" (its file's bytes
        or b"")}.
      objects: its objects, in instance order; an object's "version" is the
        model version that made its mask (else `model_version`).
      model_version: the served version that made the masks.
      origin: who saved it (JSON), kept with the image.

    Returns:
      {"file_name" (None when removed), "instance" (PNG bytes or None),
      "hidden" (object numbers painted over)}.
    """
    masks = [o["mask"] for o in objects]
    instance = exports.instance_mask(masks) if masks else None
    instance_png = None if instance is None else png(instance)
    with self._locked():
      file_name = self._commit(item, objects, model_version, origin or {}, instance)
      self._finish_pending({file_name: instance_png} if file_name else {})
    self._changed.set()
    if instance is None:
      return {"file_name": None, "instance": None, "hidden": []}
    present = set(np.unique(instance).tolist())
    return {
      "file_name": file_name,
      "instance": instance_png,
      "hidden": [i for i in range(1, len(masks) + 1) if i not in present],
    }

  def remove_origin(self, **match: Any) -> List[str]:
    """Removes the images whose origin holds every `match` field (a tool's
    annotation, say), with their files; returns their file names."""
    with self._locked():
      with self._transaction() as db:
        names = [
          r[0]
          for r in db.execute("SELECT file_name, origin FROM images")
          if all(json.loads(r[1]).get(k) == v for k, v in match.items())
        ]
        for name in names:
          self._delete(db, name)
      self._finish_pending({})
    if names:
      self._changed.set()
    return names

  def _commit(self, item, objects, version, origin, instance) -> Optional[str]:
    """The save's transaction (under the lock): rows, the pending work, and
    a new image's hidden file; returns the image's file name."""
    now = time.time()
    with self._transaction() as db:
      old = db.execute(
        "SELECT file_name FROM images WHERE digest = ?", (item["digest"],)
      ).fetchone()
      if instance is None:
        if old is not None:
          self._delete(db, old[0])
        return None
      file_name = old[0] if old else self._new_name(db, item)
      if old is None:
        h, w = instance.shape
        db.execute(
          "INSERT INTO images VALUES (?, ?, ?, ?, ?)",
          (file_name, item["digest"], h, w, json.dumps(origin)),
        )
        if self.dir:
          exports.write_file(self._pending_path(file_name), item.get("data") or png(item["image"]))
      elif origin:
        db.execute(
          "UPDATE images SET origin = ? WHERE file_name = ?", (json.dumps(origin), file_name)
        )
      self._replace_objects(db, file_name, objects, version, now)
      self._pend(db, file_name, WRITE)
    return file_name

  def _replace_objects(self, db, file_name, objects, version, now) -> None:
    """The image's object rows; an object saved again unchanged keeps its
    time and model version."""
    before = {
      (r["counts"], r["clicks"]): r
      for r in db.execute("SELECT * FROM objects WHERE file_name = ?", (file_name,))
    }
    db.execute("DELETE FROM objects WHERE file_name = ?", (file_name,))
    for number, obj in enumerate(objects, start=1):
      row = _object_row(file_name, number, obj, version, now)
      same = before.get((row[2], row[5]))
      if same is not None:
        row = row[:6] + (same["model_version"], same["saved"])
      db.execute("INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)

  def _delete(self, db, file_name: str) -> None:
    """An image's rows deleted, its files' removal pending."""
    db.execute("DELETE FROM images WHERE file_name = ?", (file_name,))
    db.execute("DELETE FROM objects WHERE file_name = ?", (file_name,))
    self._pend(db, file_name, REMOVE)

  def _pend(self, db, file_name: str, op: str) -> None:
    db.execute("INSERT OR REPLACE INTO pending VALUES (?, ?)", (file_name, op))
    db.execute("UPDATE meta SET value = value + 1 WHERE key = 'generation'")

  def _new_name(self, db, item: Dict[str, Any]) -> str:
    """images/STEM.EXT for a new image: a stem no saved image, no pending
    removal and no image file of DIR/images has (beam-prep pairs images and
    masks by stem). Looks up only the names that begin with the stem."""
    name = item["name"]
    suffix = exports.suffix_of(name) if item.get("data") else ".png"
    stem, n = exports.stem_of(name), 1
    prefix = posixpath.join(folders.IMAGES_DIR, stem)
    taken = {
      posixpath.splitext(posixpath.basename(r[0]))[0]
      for r in db.execute(
        "SELECT file_name FROM images WHERE file_name >= ?1 AND file_name < ?1 || x'ff' UNION "
        "SELECT file_name FROM pending WHERE file_name >= ?1 AND file_name < ?1 || x'ff'",
        (prefix,),
      )
    }
    while (stem if n == 1 else f"{stem}-{n}") in taken or self._on_disk(
      stem if n == 1 else f"{stem}-{n}"
    ):
      n += 1
    return posixpath.join(folders.IMAGES_DIR, (stem if n == 1 else f"{stem}-{n}") + suffix)

  def _on_disk(self, stem: str) -> bool:
    """Whether DIR/images holds an image file of this stem (any image suffix)."""
    return bool(self.dir) and any(
      os.path.exists(os.path.join(self.dir, folders.IMAGES_DIR, stem + suffix))
      for suffix in keys.IMAGE_SUFFIXES + tuple(s.upper() for s in keys.IMAGE_SUFFIXES)
    )

  # ---- the files -----------------------------------------------------------

  def _pending_path(self, file_name: str) -> str:
    folder, base = posixpath.split(file_name)
    return os.path.join(self.dir, folder, PENDING_PREFIX + base)

  def _files(self, file_name: str):
    """(image path, mask path) of a saved image under the save dir."""
    stem = posixpath.splitext(posixpath.basename(file_name))[0]
    return (
      os.path.join(self.dir, file_name),
      os.path.join(self.dir, folders.MASKS_DIR, stem + folders.MASK_SUFFIX),
    )

  def _finish_pending(self, painted: Optional[Dict[str, bytes]] = None) -> None:
    """Does the file work of committed saves (under the lock): puts a new
    image's hidden file in place and writes its instance mask (`painted`'s
    PNG for a save that has it, else painted again from its rows: a save
    that died after its commit), or removes a removed image's files."""
    if not self.dir:
      self._db.execute("DELETE FROM pending")
      return
    for row in self._db.execute("SELECT file_name, op FROM pending").fetchall():
      file_name, op = row
      image_path, mask_path = self._files(file_name)
      if op == REMOVE:
        for path in (image_path, mask_path):
          if os.path.exists(path):
            os.remove(path)
      else:
        if os.path.exists(self._pending_path(file_name)):
          os.replace(self._pending_path(file_name), image_path)
        self._write_mask(file_name, mask_path, (painted or {}).get(file_name))
      self._db.execute("DELETE FROM pending WHERE file_name = ? AND op = ?", (file_name, op))

  def _write_mask(self, file_name: str, mask_path: str, data: Optional[bytes] = None) -> None:
    """Writes an image's instance mask PNG: `data`, or painted from its rows."""
    if data is None:
      entry = self._rows("SELECT * FROM images WHERE file_name = ?", (file_name,))
      if not entry:
        return
      masks = [exports.object_mask(a) for a in self._entry(entry[0])["annotations"]]
      data = png(exports.instance_mask(masks))
    exports.write_file(mask_path, data)

  def _remove_orphans(self) -> None:
    """Removes the hidden image files of saves that died before their
    commit (at open, under the lock: no live save has one then)."""
    images = os.path.join(self.dir, folders.IMAGES_DIR)
    for name in os.listdir(images):
      if name.startswith(PENDING_PREFIX):
        os.remove(os.path.join(images, name))

  def _import_document(self) -> None:
    """A save dir from before the store: its instances.json, imported (under the lock)."""
    path = os.path.join(self.dir, exports.COCO_FILE)
    if not os.path.exists(path):
      return
    try:
      with open(path, encoding="utf-8") as f:
        entries = exports.entries_of(json.load(f))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise ValueError(
        f"--save-dir {self.dir}: {exports.COCO_FILE} is not a COCO document "
        f"this page wrote ({type(e).__name__}: {e}); give another folder"
      ) from None
    with self._transaction() as db:
      for entry in entries:
        self._import_entry(db, entry)
      db.execute("UPDATE meta SET value = value + 1 WHERE key = 'generation'")

  def _import_entry(self, db, entry: Dict[str, Any]) -> None:
    pixels = entry.get(exports.DIGEST) or exports.file_digest(
      os.path.join(self.dir, entry["file_name"])
    )
    db.execute(
      "INSERT INTO images VALUES (?, ?, ?, ?, ?)",
      (
        entry["file_name"],
        pixels,
        entry["height"],
        entry["width"],
        json.dumps(entry.get(exports.ORIGIN, {})),
      ),
    )
    for number, ann in enumerate(entry["annotations"], start=1):
      db.execute(
        "INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
          entry["file_name"],
          number,
          ann["segmentation"]["counts"],
          ann["area"],
          json.dumps(ann["bbox"]),
          json.dumps(ann.get(exports.CLICKS, {})),
          ann.get(exports.MODEL_VERSION),
          ann.get(exports.SAVED, 0.0),
        ),
      )

  # ---- the COCO document ---------------------------------------------------

  def flush(self) -> None:
    """Writes DIR/instances.json from the store, when a change is not in it yet.

    The document is read from a snapshot (its own connection: saves go on
    meanwhile) and written beside; the lock is held only to put it in
    place, and only when no newer document got there first."""
    if not self.dir:
      return
    with self._document_lock:
      if self._reader is None:
        self._reader = _connect(os.path.join(self.dir, DB_FILE), schema=False)
        self._reader.row_factory = sqlite3.Row
      generation, written, document = _snapshot(self._reader)
      path = os.path.join(self.dir, exports.COCO_FILE)
      if generation == written and os.path.exists(path):
        return
      tmp = os.path.join(self.dir, f".{exports.COCO_FILE}.{os.getpid()}.tmp")
      with open(tmp, "wb") as f:
        f.write(document)
      with self._locked():
        now = self._rows("SELECT value FROM meta WHERE key = 'document'")[0][0]
        if generation > now or not os.path.exists(path):
          os.replace(tmp, path)
          self._db.execute("UPDATE meta SET value = ? WHERE key = 'document'", (generation,))
        else:
          os.remove(tmp)

  def _write_documents(self) -> None:
    """The writer thread: the document after saves, at most a third of the
    time busy (a large store's document takes a while to write)."""
    delay = DOCUMENT_DELAY_S
    while not self._closed:
      self._changed.wait()
      if self._closed:
        return
      time.sleep(delay)
      self._changed.clear()
      started = time.monotonic()
      try:
        self.flush()
      except Exception:  # pylint: disable=broad-except
        import logging  # pylint: disable=g-import-not-at-top

        logging.getLogger("beam_train").exception("labels: writing %s failed", exports.COCO_FILE)
      delay = max(DOCUMENT_DELAY_S, 2 * (time.monotonic() - started))

  def close(self) -> None:
    """Writes the document if it is behind, and closes the store."""
    if self._closed:
      return
    self._closed = True
    self._changed.set()
    if self._writer is not None:
      self._writer.join(timeout=30)
    self.flush()
    with self._thread_lock:
      self._db.close()
    if self._reader is not None:
      self._reader.close()
    if self.dir:
      self._lock_file.close()
