"use strict";
// The click-and-see page, an annotation tool (README: "Click and see").
//
// The image is opened once on the server (an id); each click sends the
// clicks, in the image's own pixels, with the object's previous mask, and
// gets the probabilities back as a PNG of levels (train/serve/page.py): the
// mask at threshold level L is `levels >= L`, thresholded here as the slider
// moves. The server keeps no click state: this page keeps the history of
// states (objects, the object being drawn, the threshold), so undo and redo
// restore an earlier state exactly and never ask the model again. Finished
// objects are saved on the server (/page/save) whenever they change.

const $ = (id) => document.getElementById(id);
const POSITIVE = "#00e600", NEGATIVE = "#f00000", OUTLINE = [255, 230, 0, 255];
const COLOURS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6",
                 "#bfef45", "#fabed4", "#469990", "#dcbeff", "#9a6324"];
// The server's numbers (GET /page/sources): the threshold levels and the
// default one, the protocol's clicks at most and its IoU target.
const config = {};
// A state: { objects: [object], draft: object or null (the object being drawn),
// editing: the index of the object the draft replaces (-1: a new one),
// colours: colours used so far, level: the draft's threshold level }.
// An object: { colour, clicks: [{x, y, positive}], box: [x0, y0, x1, y1] (a
// box prompt, shift-drag) or null, prob: levels PNG data URL or null, level,
// iou }. States and objects are never changed, only replaced.
const page = { id: null, name: "", width: 0, height: 0, truth: false, source: null,
               history: [], at: -1, saved: null, fileName: null, queue: Promise.resolve(),
               decoded: new Map(), rendered: 0, busy: false, preview: null };
const view = { scale: 1, fit: 1, x: 0, y: 0, drag: null, dragged: false, rubber: null };

function say(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

async function post(path, body) {
  const init = body instanceof FormData ? { method: "POST", body }
    : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const response = await fetch(path, init);
  const out = await response.json();
  if (!response.ok) throw Object.assign(new Error(out.error), { status: response.status });
  return out;
}

// The request that opens the current image again: its kept file for an upload.
function sourceRequest(source) {
  if (source.upload) {
    const form = new FormData();
    form.append("file", source.upload);
    return post("/page/upload", form);
  }
  return post("/page/open", source);
}

// A request about the open image; when the server no longer holds it (a
// restart, or pushed out of its cache), the image is opened again from its
// source and the request repeated.
async function ask(path, body) {
  try {
    return await post(path, { id: page.id, ...body });
  } catch (e) {
    if (e.status !== 404 || !page.source) throw e;
    say("The server no longer held this image: sending it again…");
    page.id = (await sourceRequest(page.source)).id;
    return post(path, { id: page.id, ...body });
  }
}

// Runs actions one after another, in the order asked.
function act(action) {
  page.queue = page.queue.then(action).catch((e) => say(e.message, true));
  return page.queue;
}

const current = () => page.history[page.at];
const split = (clicks) => ({ positive: clicks.filter((c) => c.positive).map((c) => [c.x, c.y]),
                             negative: clicks.filter((c) => !c.positive).map((c) => [c.x, c.y]) });

async function push(state) {
  page.history = page.history.slice(0, page.at + 1);
  page.history.push(state);
  page.at = page.history.length - 1;
  await settle();
}

// After a state change: draw it, and save the finished objects if they changed.
async function settle() {
  await render();
  const objects = current().objects;
  if (objects === page.saved) return;
  const out = await ask("/page/save", { objects: objects.map((o) => ({
    probabilities: o.prob, level: o.level, ...split(o.clicks), version: o.version })) });
  page.saved = objects;  // (A failed save is tried again at the next change.)
  page.fileName = out.file_name;
  if (out.saved && ![...$("saved").options].some((o) => o.value === out.file_name)) {
    $("saved").add(new Option(out.file_name, out.file_name));
    $("saved").hidden = false;
  }
  const link = $("download");
  link.hidden = !out.instance;
  if (out.instance) Object.assign(link, { href: out.instance, download: out.file_name.split("/").pop().replace(/\.\w+$/, ".png") });
  const where = out.saved ? `saved as ${out.file_name} under --save-dir`
    : out.file_name ? "kept on the server (start it with --save-dir DIR to write files)" : "no object saved";
  const hidden = out.hidden.length ? `; object ${out.hidden.join(", ")} is painted over by others (drop or redo it)` : "";
  $("saved-note").textContent = `${objects.length} object${objects.length === 1 ? "" : "s"} ${where}${hidden}.`;
  $("saved-note").className = hidden ? "warn" : "";
}

// ---- masks -----------------------------------------------------------------

// The levels of a probabilities PNG, one byte per pixel (decoded once, kept
// for the objects on show).
async function levelsOf(url) {
  if (page.decoded.has(url)) return page.decoded.get(url);
  const bitmap = await createImageBitmap(await (await fetch(url)).blob(),
                                         { colorSpaceConversion: "none", premultiplyAlpha: "none" });
  const canvas = Object.assign(document.createElement("canvas"), { width: bitmap.width, height: bitmap.height });
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(bitmap, 0, 0);
  const rgba = ctx.getImageData(0, 0, bitmap.width, bitmap.height).data;
  const levels = new Uint8Array(bitmap.width * bitmap.height);
  for (let i = 0; i < levels.length; i++) levels[i] = rgba[4 * i];
  page.decoded.set(url, levels);
  return levels;
}

async function pixelsOf(obj, level) {
  if (!obj || !obj.prob) return 0;
  const levels = await levelsOf(obj.prob);
  let n = 0;
  for (let i = 0; i < levels.length; i++) n += levels[i] >= level;
  return n;
}

// What is on show, in list order: the finished objects, the draft in place
// of the one it edits (or last). Each: { obj, level, number, draft }.
function shown(state) {
  const out = state.objects.map((obj, i) => ({ obj, level: obj.level, number: i + 1, draft: false }));
  if (state.draft) {
    const entry = { obj: state.draft, level: page.preview || state.level, draft: true };
    if (state.editing >= 0) out[state.editing] = { ...entry, number: state.editing + 1 };
    else out.push({ ...entry, number: out.length + 1 });
  }
  return out;
}

const rgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));

// Paints the objects as the saved instance mask paints them (largest first,
// so a small object on a large one stays visible); the draft's border white.
function paint(entries, levels) {
  const n = page.width * page.height, w = page.width, owner = new Int16Array(n).fill(-1);
  const areas = entries.map((e, k) => {
    let a = 0;
    if (levels[k]) for (let i = 0; i < n; i++) a += levels[k][i] >= e.level;
    return a;
  });
  const order = entries.map((_, k) => k).sort((a, b) => areas[b] - areas[a] || a - b);
  for (const k of order) {
    const q = levels[k], level = entries[k].level;
    if (q) for (let i = 0; i < n; i++) if (q[i] >= level) owner[i] = k;
  }
  const image = new ImageData(page.width, page.height), pixels = new Uint32Array(image.data.buffer);
  const pack = ([r, g, b]) => ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;  // RGBA, little-endian
  const colours = entries.map((e) => pack(rgb(COLOURS[e.obj.colour % COLOURS.length])));
  const draft = entries.findIndex((e) => e.draft), white = pack([255, 255, 255]);
  for (let i = 0; i < n; i++) {
    const k = owner[i];
    if (k < 0) continue;
    pixels[i] = colours[k];
    if (k === draft) {
      const x = i % w;
      if (x === 0 || x === w - 1 || i < w || i >= n - w || owner[i - 1] !== k || owner[i + 1] !== k
          || owner[i - w] !== k || owner[i + w] !== k) pixels[i] = white;
    }
  }
  $("mask").getContext("2d").putImageData(image, 0, 0);
  return areas;
}

// The draft's clicks and box, and the box being dragged (dashed).
function drawMarks(state) {
  const svg = $("marks"), r = 7 / view.scale;
  svg.setAttribute("viewBox", `0 0 ${page.width} ${page.height}`);
  const rect = (b, dash) => `<rect x="${b[0]}" y="${b[1]}" width="${b[2] - b[0] + 1}" height="${b[3] - b[1] + 1}" fill="none" stroke="${POSITIVE}" stroke-width="${2 / view.scale}"${dash ? ` stroke-dasharray="${6 / view.scale}"` : ""}/>`;
  const box = view.rubber || (state.draft && state.draft.box);
  svg.innerHTML = (box ? rect(box, Boolean(view.rubber)) : "") + ((state.draft && state.draft.clicks) || []).map((c) =>
    `<circle cx="${c.x + 0.5}" cy="${c.y + 0.5}" r="${r}" fill="${c.positive ? POSITIVE : NEGATIVE}" stroke="#fff" stroke-width="${r / 3}"/>`).join("");
}

function listObjects(state, entries, areas) {
  const list = $("objects");
  list.replaceChildren(...entries.map((e, k) => {
    const li = document.createElement("li");
    li.className = e.draft ? "selected" : "";
    li.innerHTML = `<span class="swatch" style="background:${COLOURS[e.obj.colour % COLOURS.length]}"></span>`
      + `<span class="name">Object ${e.number}${e.draft && state.editing < 0 ? " (drawing)" : ""}: ${areas[k]} px</span>`
      + (e.obj.version != null ? `<span class="version" title="the mask of model version ${e.obj.version}">v${e.obj.version}</span>` : "");
    if (!(e.draft && state.editing < 0)) {
      const del = Object.assign(document.createElement("button"), { textContent: "×", title: "delete this object" });
      del.onclick = (event) => { event.stopPropagation(); act(() => removeObject(e.number - 1)); };
      li.append(del);
      li.onclick = () => act(() => select(e.number - 1));
    }
    return li;
  }));
}

async function render() {
  const state = current(), seq = ++page.rendered;
  const entries = shown(state);
  const levels = await Promise.all(entries.map((e) => e.obj.prob && levelsOf(e.obj.prob)));
  if (seq !== page.rendered) return;
  const keep = new Set(page.history.slice(Math.max(0, page.at - 2), page.at + 3)
    .flatMap((s) => shown(s).map((e) => e.obj.prob)));
  for (const url of page.decoded.keys()) if (!keep.has(url)) page.decoded.delete(url);
  const areas = paint(entries, levels);
  drawMarks(state);
  listObjects(state, entries, areas);
  const draft = state.draft, clicks = draft ? draft.clicks : [];
  $("undo").disabled = page.at <= 0;
  $("redo").disabled = page.at >= page.history.length - 1;
  $("reset").disabled = !clicks.length && !(draft && draft.box);
  $("finish").disabled = !draft;
  $("delete").disabled = state.editing < 0;
  $("simulate").disabled = !page.truth || page.busy;
  $("threshold").value = page.preview || state.level;
  $("level").textContent = ((page.preview || state.level) / config.levels).toFixed(2);
  const n = clicks.length;
  $("iou").textContent = draft && draft.iou != null ? `IoU ${draft.iou.toFixed(3)} after ${n} click${n > 1 ? "s" : ""}` : "";
  const mine = entries.findIndex((e) => e.draft);
  const { positive, negative } = split(clicks);
  if (!draft) say(`${page.name}: ${state.objects.length} object${state.objects.length === 1 ? "" : "s"}; click on the next object, or on one in the list to edit it.`);
  else if (!positive.length && !draft.box) say(n ? "Add a positive click (left click) on the object, or a box (shift-drag)." : `${page.name}: click on the object.`);
  else say(`${areas[mine]} pixels in the mask of object ${entries[mine].number}; ${positive.length} positive, ${negative.length} negative clicks.`);
}

// ---- actions (run one at a time by act) -------------------------------------

async function addClick(x, y, positive) {
  const draft = current().draft || { clicks: [], box: null, prob: null };
  await predictDraft([...draft.clicks, { x, y, positive }], draft.box || null, draft.prob);
}

// A box prompt (x0, y0, x1, y1) for the draft: its clicks kept, its mask predicted anew.
async function addBox(box) {
  const draft = current().draft || { clicks: [] };
  await predictDraft(draft.clicks, box, null);
}

// The draft with these clicks and box, its mask asked of the model (refining
// `previous`) once there is a positive click or a box.
async function predictDraft(clicks, box, previous) {
  const state = current();
  const draft = state.draft || { colour: state.colours, clicks: [], box: null, prob: null, iou: null };
  let prob = null, iou = null, version = null;
  if (clicks.some((c) => c.positive) || box) {
    const out = await ask("/page/segment", { ...split(clicks), box, level: state.level, previous });
    ({ probabilities: prob, iou, version } = out);
    showVersion(version);
  }
  await push({ ...state, draft: { ...draft, clicks, box, prob, iou, version },
               colours: state.draft ? state.colours : state.colours + 1 });
}

// Keeps the draft as a finished object (in place of the one it edits).
async function finish() {
  const state = current(), draft = state.draft;
  if (!draft) return say("No object in progress: click on an object to start one.");
  if (!(await pixelsOf(draft, state.level))) {
    if (state.editing < 0 && draft.clicks.length) return say("This object has no mask yet: click on it, or reset it (r).", true);
    return push({ ...state, draft: null, editing: -1 });
  }
  const kept = state.objects[state.editing];
  if (kept === draft && kept.level === state.level) return push({ ...state, draft: null, editing: -1 });
  const done = { ...draft, level: state.level };
  const objects = state.editing >= 0 ? state.objects.map((o, i) => (i === state.editing ? done : o))
    : [...state.objects, done];
  await push({ ...state, objects, draft: null, editing: -1 });
}

async function select(i) {
  if (current().editing === i) return;
  if (current().draft) await finish();
  const state = current();
  if (state.draft) return;  // A draft without a mask stays: say so (finish did).
  await push({ ...state, draft: state.objects[i], editing: i, level: state.objects[i].level });
}

async function removeObject(i) {
  const state = current();
  if (i < 0 || i >= state.objects.length) return say("Select an object in the list first.");
  const editing = state.editing === i ? -1 : state.editing - (state.editing > i);
  await push({ ...state, objects: state.objects.filter((_, k) => k !== i),
               draft: state.editing === i ? null : state.draft, editing });
}

async function reset() {
  const state = current();
  if (!state.draft) return;
  const draft = state.editing >= 0 ? { ...state.draft, clicks: [], box: null, prob: null, iou: null } : null;
  await push({ ...state, draft });
}

async function move(step) {
  const at = page.at + step;
  if (at < 0 || at >= page.history.length) return;
  page.at = at;
  await settle();
}

async function setLevel(level) {
  page.preview = null;
  const state = current();
  let draft = state.draft;
  if (level === state.level) return render();
  if (draft && draft.prob && page.truth) {
    draft = { ...draft, iou: (await ask("/page/iou", { probabilities: draft.prob, level })).iou };
  }
  await push({ ...state, level, draft });
}

// The NoC protocol, one click at a time, the server choosing each click.
async function simulate() {
  page.busy = true;
  try {
    while (true) {
      const state = current(), clicks = state.draft ? state.draft.clicks : [];
      if (clicks.length >= config.max_clicks) break;
      const next = await ask("/page/next_click", { ...split(clicks), level: state.level,
                                                  probabilities: state.draft ? state.draft.prob : null });
      if (!next.click) { say("No error left: the mask matches the true mask."); break; }
      await addClick(next.click[0], next.click[1], next.kind === "positive");
      if (current().draft.iou >= config.iou_target) break;
    }
  } finally {
    page.busy = false;
    $("simulate").disabled = !page.truth;
  }
}

// ---- opening images ----------------------------------------------------------

async function drawTruth() {
  const ctx = $("truth").getContext("2d");
  ctx.clearRect(0, 0, page.width, page.height);
  $("outline-toggle").hidden = !page.truth;
  if (!page.truth) return;
  const truth = await levelsOf(`/page/truth/${page.id}.png`);
  page.decoded.delete(`/page/truth/${page.id}.png`);
  const w = page.width, n = truth.length, image = new ImageData(w, page.height);
  const object = (i) => truth[i] === 1;
  for (let i = 0; i < n; i++) {
    const x = i % w;
    if (object(i) && (x === 0 || x === w - 1 || i < w || i >= n - w || !object(i - 1)
        || !object(i + 1) || !object(i - w) || !object(i + w))) image.data.set(OUTLINE, 4 * i);
  }
  ctx.putImageData(image, 0, 0);
}

async function open(request, source) {
  if (page.id && current().draft) await finish();  // The image left keeps its last object.
  const info = await request;
  $("upload").value = "";  // Choosing the same file again opens it again.
  document.activeElement.blur();  // The keys are the page's again (not the picker's).
  const objects = info.objects.map((o, i) => ({
    colour: i, level: o.level, prob: o.probabilities, iou: null, version: o.version,
    clicks: [...o.positive.map(([x, y]) => ({ x, y, positive: true })),
             ...o.negative.map(([x, y]) => ({ x, y, positive: false }))] }));
  Object.assign(page, { id: info.id, name: info.name, width: info.width, height: info.height,
                        truth: info.truth, source, saved: objects, fileName: info.saved_as,
                        history: [], at: -1, decoded: new Map(), preview: null });
  const img = new Image();
  img.src = `/page/image/${info.id}.png`;
  await img.decode();
  for (const id of ["image", "mask", "truth", "clicks"]) {
    Object.assign($(id), { width: info.width, height: info.height });
  }
  $("image").getContext("2d").drawImage(img, 0, 0);
  await drawTruth();
  fit();
  $("download").hidden = true;
  $("saved-note").textContent = objects.length ? `${objects.length} saved object${objects.length === 1 ? "" : "s"} of ${info.saved_as} opened.` : "";
  await push({ objects, draft: null, editing: -1, colours: objects.length, level: config.level });
}

// ---- zoom and pan ------------------------------------------------------------

function place() {
  Object.assign($("stage").style, { left: `${view.x}px`, top: `${view.y}px`,
    width: `${page.width * view.scale}px`, height: `${page.height * view.scale}px` });
  if (page.at >= 0) drawMarks(current());
}

// The whole image in the window (small images enlarged up to 8 times).
function fit() {
  const box = $("view");
  box.style.height = `${Math.max(200, window.innerHeight - box.getBoundingClientRect().top - 16)}px`;
  if (!page.id) return;
  view.scale = view.fit = Math.min(box.clientWidth / page.width, box.clientHeight / page.height, 8);
  view.x = (box.clientWidth - page.width * view.scale) / 2;
  view.y = (box.clientHeight - page.height * view.scale) / 2;
  place();
}

// Zooms by `factor` keeping the point (cx, cy) of the view in place.
function zoom(factor, cx = $("view").clientWidth / 2, cy = $("view").clientHeight / 2) {
  if (!page.id) return;
  const scale = Math.min(Math.max(view.scale * factor, view.fit / 2), Math.max(64, view.fit * 4));
  view.x = cx - (cx - view.x) * scale / view.scale;
  view.y = cy - (cy - view.y) * scale / view.scale;
  view.scale = scale;
  place();
}

// A click's pixel in the image: the canvas's box is the zoomed, panned stage.
function pixelOf(event) {
  const box = $("clicks").getBoundingClientRect();
  const x = Math.floor((event.clientX - box.left) * page.width / box.width);
  const y = Math.floor((event.clientY - box.top) * page.height / box.height);
  return [Math.min(Math.max(x, 0), page.width - 1), Math.min(Math.max(y, 0), page.height - 1)];
}

function onClick(event, positive) {
  event.preventDefault();
  if (view.dragged) { view.dragged = false; return; }  // The end of a pan.
  if (!page.id) return;
  const [x, y] = pixelOf(event);
  act(() => addClick(x, y, positive));
}

// ---- keys ------------------------------------------------------------------

const toggle = (id) => { $(id).checked = !$(id).checked; $(id).onchange(); };
const SHORTCUTS = [
  { keys: ["n", "Enter"], does: "finish the object, start the next", run: () => act(finish) },
  { keys: ["ctrl+z", "u"], does: "undo", run: () => act(() => move(-1)) },
  { keys: ["ctrl+shift+z", "ctrl+y", "y"], does: "redo", run: () => act(() => move(1)) },
  { keys: ["r"], does: "reset the object's clicks and box", run: () => act(reset) },
  { keys: ["Delete", "Backspace"], does: "delete the selected object", run: () => act(() => removeObject(current().editing)) },
  { keys: ["h"], does: "hide or show the masks", run: () => toggle("overlay") },
  { keys: ["t"], does: "hide or show the true outline", run: () => toggle("outline") },
  { keys: ["[", "]"], does: "threshold down, up", run: (key) => act(() => setLevel(Math.min(Math.max(current().level + (key === "]" ? 1 : -1), 1), config.levels - 1))) },
  { keys: ["+", "-", "0"], does: "zoom in, out, fit", run: (key) => (key === "0" ? fit() : zoom(key === "+" ? 1.25 : 0.8)) },
  { keys: ["s"], does: "simulated user (eval objects)", run: () => page.truth && !page.busy && act(simulate) },
];
const MOUSE = [["left click", "on the object"], ["right / shift click", "off the object"],
               ["shift drag", "a box around the object"], ["wheel, drag", "zoom, pan"],
               ["list entry", "edit that object"]];

function keyName(event) {
  const ctrl = event.ctrlKey || event.metaKey;
  const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;
  return (ctrl ? "ctrl+" : "") + (ctrl && event.shiftKey ? "shift+" : "") + (key === "=" ? "+" : key);
}

document.addEventListener("keydown", (event) => {
  if (!page.id || event.target.matches("input[type=text], select, textarea")) return;
  const key = keyName(event);
  const shortcut = SHORTCUTS.find((s) => s.keys.includes(key));
  if (!shortcut) return;
  event.preventDefault();
  shortcut.run(key);
});

$("keys").replaceChildren(...[...SHORTCUTS.map((s) => [s.keys.join(", "), s.does]), ...MOUSE].flatMap(([k, d]) => [
  Object.assign(document.createElement("dt"), { textContent: k.replace(/ctrl\+/g, "ctrl/⌘+") }),
  Object.assign(document.createElement("dd"), { textContent: d })]));

// ---- wiring -------------------------------------------------------------------

// The model's name and the version serving (a newer export is served as it appears).
function showVersion(version) {
  if (version == null || version === config.version) return;
  config.version = version;
  $("model").textContent = `${config.model} (version ${version})`;
}

async function sources() {
  const src = await (await fetch("/page/sources")).json();
  Object.assign(config, { level: src.level, levels: src.levels, max_clicks: src.max_clicks,
                          iou_target: src.iou_target });
  Object.assign($("threshold"), { max: src.levels - 1, value: src.level });
  $("level").textContent = (src.level / src.levels).toFixed(2);
  config.model = src.model;
  showVersion(src.version);
  if (!src.segments) say("This model does not take clicks: the page cannot use it.", true);
  for (const [id, names, value] of [["files", src.files, (f) => f], ["evals", src.eval, (_, i) => i],
                                    ["saved", src.saved, (f) => f]]) {
    names.forEach((name, i) => $(id).add(new Option(name, value(name, i))));
    $(id).hidden = !names.length;
  }
}

$("clicks").addEventListener("click", (e) => onClick(e, !e.shiftKey));
$("clicks").addEventListener("contextmenu", (e) => onClick(e, false));
// A drag pans; a shift-drag draws a box prompt (from its first pixel to its last).
$("clicks").addEventListener("mousedown", (e) => {
  if (e.button !== 0) return;
  view.drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false,
                from: e.shiftKey && page.id ? pixelOf(e) : null };
});
const boxOf = (from, e) => {
  const [x, y] = pixelOf(e);
  return [Math.min(from[0], x), Math.min(from[1], y), Math.max(from[0], x), Math.max(from[1], y)];
};
window.addEventListener("mousemove", (e) => {
  const drag = view.drag;
  if (!drag || (!drag.moved && Math.hypot(e.clientX - drag.x, e.clientY - drag.y) < 5)) return;
  drag.moved = true;
  if (drag.from) {
    view.rubber = boxOf(drag.from, e);
    return drawMarks(current());
  }
  $("view").classList.add("panning");
  Object.assign(view, { x: drag.vx + e.clientX - drag.x, y: drag.vy + e.clientY - drag.y });
  place();
});
window.addEventListener("mouseup", (e) => {
  const drag = view.drag;
  // The click event that ends a drag on the image is no click (onClick).
  view.dragged = Boolean(drag && drag.moved) && e.target === $("clicks");
  view.drag = view.rubber = null;
  $("view").classList.remove("panning");
  if (drag && drag.moved && drag.from) {
    const box = boxOf(drag.from, e);
    act(() => addBox(box));
  }
});
$("view").addEventListener("wheel", (e) => {
  e.preventDefault();
  const box = $("view").getBoundingClientRect();
  zoom(e.deltaY < 0 ? 1.25 : 0.8, e.clientX - box.left, e.clientY - box.top);
}, { passive: false });
$("finish").onclick = () => act(finish);
$("undo").onclick = () => act(() => move(-1));
$("redo").onclick = () => act(() => move(1));
$("reset").onclick = () => act(reset);
$("delete").onclick = () => act(() => removeObject(current().editing));
$("simulate").onclick = () => act(simulate);
$("zoom-in").onclick = () => zoom(1.25);
$("zoom-out").onclick = () => zoom(0.8);
$("zoom-fit").onclick = fit;
$("threshold").oninput = () => { page.preview = Number($("threshold").value); render(); };
$("threshold").onchange = () => act(() => setLevel(Number($("threshold").value)));
$("opacity").oninput = () => { $("mask").style.opacity = $("opacity").value / 100; };
$("overlay").onchange = () => { $("mask").hidden = !$("overlay").checked; };
$("outline").onchange = () => { $("truth").hidden = !$("outline").checked; };
$("upload").onchange = () => {
  const file = $("upload").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file);
  act(() => open(post("/page/upload", form), { upload: file }));
};
for (const [id, field, value] of [["files", "file", String], ["evals", "eval", Number], ["saved", "saved", String]]) {
  $(id).onchange = () => {
    if (!$(id).value) return;
    const source = { [field]: value($(id).value) };
    act(() => open(post("/page/open", source), source));
  };
}
// A closed tab keeps the object being drawn: sent as a finished object.
window.addEventListener("pagehide", () => {
  const state = page.at >= 0 && current();
  if (!state || !state.draft || !state.draft.prob) return;
  const objects = shown(state).map((e) => ({ probabilities: e.obj.prob, level: e.level, ...split(e.obj.clicks), version: e.obj.version }));
  navigator.sendBeacon("/page/save", new Blob([JSON.stringify({ id: page.id, objects })], { type: "application/json" }));
});
window.addEventListener("resize", fit);
$("mask").style.opacity = 0.5;
fit();
sources().catch((e) => say(e.message, true));
window.labelPage = { page, current };  // For tests and the console.
