"use strict";
// The click-and-see page. The image is opened once on the server (an id);
// each click sends only the clicks, in the image's own pixels, and gets the
// mask back as PNG (README: "Click and see").

const $ = (id) => document.getElementById(id);
const POSITIVE = "#00e600", NEGATIVE = "#f00000";
const page = { id: null, name: "", width: 0, height: 0, truth: false, clicks: [], shown: 0 };

function say(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}

async function post(path, body) {
  const init = body instanceof FormData ? { method: "POST", body }
    : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const response = await fetch(path, init);
  const out = await response.json();
  if (!response.ok) throw new Error(out.error);
  return out;
}

// The canvases keep the image's pixels; the stage is scaled to fit the window.
function fit() {
  if (!page.id) return;
  const room = { w: window.innerWidth - 32, h: window.innerHeight - $("stage").offsetTop - 16 };
  const scale = Math.min(room.w / page.width, room.h / page.height, 8);
  $("stage").style.width = `${Math.floor(page.width * scale)}px`;
  $("stage").style.height = `${Math.floor(page.height * scale)}px`;
}

async function open(request) {
  try {
    const info = await request;
    Object.assign(page, { id: info.id, name: info.name, width: info.width, height: info.height,
                          truth: info.truth, clicks: [] });
    const img = new Image();
    img.src = `/page/image/${info.id}.png`;
    await img.decode();
    for (const id of ["image", "mask", "clicks"]) {
      Object.assign($(id), { width: info.width, height: info.height });
    }
    $("image").getContext("2d").drawImage(img, 0, 0);
    $("simulate").disabled = !info.truth;
    fit();
    await update();
  } catch (e) {
    say(e.message, true);
  }
}

function drawClicks() {
  const ctx = $("clicks").getContext("2d");
  ctx.clearRect(0, 0, page.width, page.height);
  const r = Math.max(2, Math.max(page.width, page.height) / 90);
  for (const { x, y, positive } of page.clicks) {
    ctx.beginPath();
    ctx.arc(x + 0.5, y + 0.5, r, 0, 2 * Math.PI);
    ctx.fillStyle = positive ? POSITIVE : NEGATIVE;
    ctx.fill();
    ctx.lineWidth = r / 3;
    ctx.strokeStyle = "#fff";
    ctx.stroke();
  }
}

async function drawMask(url) {
  const ctx = $("mask").getContext("2d");
  ctx.clearRect(0, 0, page.width, page.height);
  if (!url) return;
  const img = new Image();
  img.src = url;
  await img.decode();
  ctx.drawImage(img, 0, 0);
}

// Asks for the mask of the current clicks; an answer overtaken by a newer
// click is dropped.
async function update() {
  drawClicks();
  const seq = ++page.shown;
  const positive = page.clicks.filter((c) => c.positive).map((c) => [c.x, c.y]);
  const negative = page.clicks.filter((c) => !c.positive).map((c) => [c.x, c.y]);
  $("undo").disabled = $("reset").disabled = !page.clicks.length;
  if (!positive.length) {
    await drawMask(null);
    $("download").hidden = true;
    $("iou").textContent = "";
    say(page.clicks.length ? "Add a positive click (left click) on the object." : `${page.name}: click on the object.`);
    return null;
  }
  const out = await post("/page/segment", { id: page.id, positive, negative });
  if (seq !== page.shown) return null;
  await drawMask(out.overlay);
  Object.assign($("download"), { href: out.mask, download: `${page.name.replace(/\W+/g, "_")}_mask.png`, hidden: false });
  const n = page.clicks.length;
  $("iou").textContent = out.iou === null ? "" : `IoU ${out.iou.toFixed(3)} after ${n} click${n > 1 ? "s" : ""}`;
  say(`${out.pixels} pixels in the mask; ${positive.length} positive, ${negative.length} negative clicks.`);
  return out;
}

function addClick(event, positive) {
  event.preventDefault();
  if (!page.id) return;
  const box = $("clicks").getBoundingClientRect();
  const x = Math.floor((event.clientX - box.left) * page.width / box.width);
  const y = Math.floor((event.clientY - box.top) * page.height / box.height);
  page.clicks.push({ x: Math.min(Math.max(x, 0), page.width - 1),
                     y: Math.min(Math.max(y, 0), page.height - 1), positive });
  update().catch((e) => say(e.message, true));
}

// The NoC protocol, one click at a time, the server choosing each click.
async function simulate() {
  $("simulate").disabled = true;
  try {
    for (let n = page.clicks.length; n < 20; n++) {
      const positive = page.clicks.filter((c) => c.positive).map((c) => [c.x, c.y]);
      const negative = page.clicks.filter((c) => !c.positive).map((c) => [c.x, c.y]);
      const next = await post("/page/next_click", { id: page.id, positive, negative });
      if (!next.click) { say("No error left: the mask matches the true mask."); break; }
      page.clicks.push({ x: next.click[0], y: next.click[1], positive: next.kind === "positive" });
      const out = await update();
      if (out && out.iou >= 0.9) break;
    }
  } catch (e) {
    say(e.message, true);
  }
  $("simulate").disabled = !page.truth;
}

async function sources() {
  const src = await (await fetch("/page/sources")).json();
  $("model").textContent = `${src.model} (version ${src.version})`;
  if (!src.segments) say("This model does not take clicks: the page cannot use it.", true);
  src.files.forEach((f) => $("files").add(new Option(f, f)));
  src.eval.forEach((name, i) => $("evals").add(new Option(name, i)));
  $("files").hidden = !src.files.length;
  $("evals").hidden = !src.eval.length;
}

$("clicks").addEventListener("click", (e) => addClick(e, !e.shiftKey));
$("clicks").addEventListener("contextmenu", (e) => addClick(e, false));
$("undo").onclick = () => { page.clicks.pop(); update().catch((e) => say(e.message, true)); };
$("reset").onclick = () => { page.clicks = []; update().catch((e) => say(e.message, true)); };
$("simulate").onclick = simulate;
$("opacity").oninput = () => { $("mask").style.opacity = $("opacity").value / 100; };
$("upload").onchange = () => {
  const form = new FormData();
  form.append("file", $("upload").files[0]);
  open(post("/page/upload", form));
};
$("files").onchange = () => $("files").value && open(post("/page/open", { file: $("files").value }));
$("evals").onchange = () => $("evals").value && open(post("/page/open", { eval: Number($("evals").value) }));
window.addEventListener("resize", fit);
$("mask").style.opacity = 0.5;
sources().catch((e) => say(e.message, true));
