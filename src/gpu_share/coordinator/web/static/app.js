// GPU Share pages: a little progressive enhancement. Every page works without it.
"use strict";

// Forms: show "other model" and schedule fields only when they apply.
function syncToggles(root) {
  root.querySelectorAll("select[data-other]").forEach((select) => {
    const wrap = document.getElementById(select.dataset.other);
    if (wrap) wrap.hidden = select.value !== "other";
  });
  root.querySelectorAll("input[type=radio][data-schedule]:checked").forEach((radio) => {
    const wrap = document.getElementById(radio.dataset.schedule);
    if (wrap) wrap.hidden = radio.value !== "schedule";
  });
}

// Forms: one more GPU entry, numbered after the last one.
function addEntry(button) {
  const list = document.querySelector(button.dataset.addEntry);
  const entries = list.querySelectorAll(".gpu-entry");
  const last = entries[entries.length - 1];
  const from = last.dataset.index;
  const to = String(Math.max(...Array.from(entries, (e) => Number(e.dataset.index))) + 1);
  const copy = last.cloneNode(true);
  copy.dataset.index = to;
  const rename = (value) => value && value.replaceAll(`gpu-${from}-`, `gpu-${to}-`);
  copy.querySelectorAll("[id],[for],[name],[data-other],[data-schedule],[aria-describedby],[aria-labelledby]").forEach((el) => {
    for (const attr of ["id", "for", "name", "data-other", "data-schedule", "aria-describedby", "aria-labelledby"]) {
      if (el.hasAttribute(attr)) el.setAttribute(attr, rename(el.getAttribute(attr)));
    }
  });
  copy.querySelectorAll(".error").forEach((el) => el.remove());
  copy.querySelectorAll(".invalid").forEach((el) => el.classList.remove("invalid"));
  copy.querySelectorAll("input[type=text],input[type=number]").forEach((input) => {
    input.value = input.name.endsWith("-count") ? "1" : input.name.endsWith("-timezone") ? "UTC" : "";
  });
  copy.querySelectorAll("select").forEach((select) => { select.value = ""; });
  copy.querySelector("legend").textContent = `GPUs (${entries.length + 1})`;
  list.appendChild(copy);
  syncToggles(copy);
  copy.querySelector("select").focus();
}

// Charts: a sparkline of `values` (oldest first) drawn into an <svg class="spark">;
// returns the top of its scale (null when there is nothing to draw).
function drawSpark(svg, values, max) {
  const width = 200, height = 40;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const numbers = values.filter((v) => v !== null && v !== undefined);
  if (numbers.length < 2) { svg.innerHTML = ""; return null; }
  const top = max || Math.max(...numbers, 1) * 1.25;  // no scale given: leave headroom
  const step = width / (values.length - 1);
  const points = values.map((v, i) => [i * step, height - 2 - ((v || 0) / top) * (height - 4)]);
  const line = points.map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  svg.innerHTML = `<path class="area" d="${line} L${width},${height} L0,${height} Z"></path><path d="${line}"></path>`;
  return top;
}

function drawAllSparks(root) {
  root.querySelectorAll("svg.spark[data-values]").forEach((svg) => {
    const top = drawSpark(svg, JSON.parse(svg.dataset.values), Number(svg.dataset.max) || null);
    // A scale the page could not name (no fixed top, such as power): the one drawn.
    const label = svg.parentElement.querySelector("[data-spark-top]");
    if (label && !label.textContent && top !== null) {
      label.textContent = `0–${Math.round(top)} ${svg.dataset.unit || ""}`.trim();
    }
  });
}

// Live regions: re-fetch a fragment of this page and swap it in, every few seconds.
function liveRegions() {
  document.querySelectorAll("[data-live]").forEach((region) => {
    const every = Number(region.dataset.every || 5) * 1000;
    const refresh = async () => {
      try {
        const response = await fetch(region.dataset.live, { credentials: "same-origin", headers: { Accept: "text/html" } });
        // Not while a form in it (a machine's name) is being typed into, holds what was
        // typed, or says what is wrong with it: the swap would lose that.
        const busy = [...region.querySelectorAll("input, select, textarea")].some((field) =>
          field === document.activeElement || field.getAttribute("aria-invalid") === "true" ||
          (field.type !== "hidden" && "defaultValue" in field && field.value !== field.defaultValue));
        if (response.ok && !busy) {
          region.innerHTML = await response.text();
          drawAllSparks(region);
        }
      } catch (error) { /* offline for a moment: try again next round */ }
      setTimeout(refresh, every);
    };
    setTimeout(refresh, every);
  });
}

// Logs: follow an invoke's log until it is final.
function followLogs() {
  document.querySelectorAll("pre[data-follow]").forEach((pre) => {
    let cursor = Number(pre.dataset.cursor || 0);
    const status = document.querySelector(pre.dataset.statusTarget || "#invoke-status");
    const step = async () => {
      try {
        const response = await fetch(`${pre.dataset.follow}?after=${cursor}`, { credentials: "same-origin" });
        if (response.ok) {
          const text = await response.text();
          if (text) {
            const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
            pre.textContent += text;
            if (atBottom) pre.scrollTop = pre.scrollHeight;
          }
          cursor = Number(response.headers.get("X-Log-Cursor") || cursor);
          const state = response.headers.get("X-Invoke-Status");
          if (status && state) {
            status.textContent = state;
            status.className = `badge s-${state}`;
          }
          if (["done", "failed", "timeout", "canceled"].includes(state)) {
            if (pre.dataset.reloadWhenFinal !== undefined && pre.dataset.finalSeen === undefined) {
              pre.dataset.finalSeen = "1";
              window.location.reload();
            }
            return;
          }
        }
      } catch (error) { /* try again */ }
      setTimeout(step, 1000);
    };
    step();
  });
}

// Uploads: stream the file with a progress bar, then go where the server says.
function uploads() {
  document.querySelectorAll("form[data-upload]").forEach((form) => {
    form.addEventListener("submit", (event) => {
      const file = form.querySelector("input[type=file]").files[0];
      if (!file) return;
      event.preventDefault();
      const kind = form.querySelector("[name=kind]").value;
      const progress = form.querySelector("progress");
      const note = form.querySelector("[data-upload-status]");
      progress.hidden = false;
      const request = new XMLHttpRequest();
      request.open("POST", `${form.dataset.upload}?kind=${encodeURIComponent(kind)}&name=${encodeURIComponent(file.name)}`);
      request.setRequestHeader("X-CSRF-Token", form.querySelector("[name=csrf]").value);
      request.setRequestHeader("Content-Type", "application/octet-stream");
      request.upload.onprogress = (e) => {
        if (e.lengthComputable) { progress.max = e.total; progress.value = e.loaded; }
        note.textContent = `${Math.round((100 * e.loaded) / (e.total || 1))} %`;
      };
      request.onload = () => {
        if (request.status >= 200 && request.status < 300) {
          window.location.href = JSON.parse(request.responseText).next;
        } else {
          let message = `upload failed (${request.status})`;
          try { message = JSON.parse(request.responseText).error.message; } catch (e) { /* keep the status */ }
          note.textContent = message;
          note.classList.add("error");
        }
      };
      request.onerror = () => { note.textContent = "the connection failed; try again"; note.classList.add("error"); };
      request.send(file);
    });
  });
}

document.addEventListener("change", (event) => {
  if (event.target.matches("select[data-other], input[data-schedule]")) syncToggles(document);
});
document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-add-entry]");
  if (button) addEntry(button);
});
document.addEventListener("DOMContentLoaded", () => {
  syncToggles(document);
  drawAllSparks(document);
  liveRegions();
  followLogs();
  uploads();
});

// Copy buttons: `data-copy` names the element whose text to copy, `data-copy-text` holds it.
// The button says "Copied" for a moment, and a polite live region says it to screen
// readers. Without the clipboard API (a plain-http page off loopback, or permission
// refused) the text is selected and copied the old way; failing that it stays selected
// and the button asks for Ctrl+C.
function copyStatus() {
  let region = document.getElementById("copy-status");
  if (!region) {
    region = document.createElement("div");
    region.id = "copy-status";
    region.className = "visually-hidden";
    region.setAttribute("role", "status");
    region.setAttribute("aria-live", "polite");
    document.body.appendChild(region);
  }
  return region;
}

function selectText(source) {
  const selection = window.getSelection();
  selection.removeAllRanges();
  const range = document.createRange();
  range.selectNodeContents(source);
  selection.addRange(range);
}

function copyBySelection(source, value) {
  let target = source;
  if (!target) {  // nothing on the page to select: a hidden element holds the text meanwhile
    target = document.createElement("span");
    target.textContent = value;
    target.className = "visually-hidden";
    document.body.appendChild(target);
  }
  selectText(target);
  let copied = false;
  try { copied = document.execCommand("copy"); } catch (error) { copied = false; }
  if (target !== source) { target.remove(); window.getSelection().removeAllRanges(); }
  return copied;
}

function showCopied(button, text, announce) {
  if (!button.dataset.label) button.dataset.label = button.textContent;
  clearTimeout(Number(button.dataset.timer || 0));
  button.textContent = text;
  button.classList.add("copied");
  copyStatus().textContent = announce;
  button.dataset.timer = String(setTimeout(() => {
    button.textContent = button.dataset.label;
    button.classList.remove("copied");
    copyStatus().textContent = "";
  }, 2000));
}

async function copyFrom(button) {
  const source = button.dataset.copy ? document.querySelector(button.dataset.copy) : null;
  const value = button.dataset.copyText ?? (source ? source.textContent.trim() : "");
  try {
    await navigator.clipboard.writeText(value);
    showCopied(button, "Copied", "Copied to the clipboard");
  } catch (error) {
    if (copyBySelection(source, value)) {
      showCopied(button, "Copied", "Copied to the clipboard");
    } else if (source) {
      selectText(source);
      showCopied(button, "Press Ctrl+C", "Selected: press Ctrl+C (or ⌘C) to copy");
    }
  }
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy], button[data-copy-text]");
  if (button) copyFrom(button);
});

// Phones: the main navigation folds behind its menu button (app.css shows the button on
// narrow screens only). Without this script the button stays hidden and the navigation
// open, so every page still works; Escape closes the menu and gives focus back.
function menus() {
  document.querySelectorAll("button[data-menu]").forEach((button) => {
    const nav = document.getElementById(button.getAttribute("aria-controls"));
    if (!nav) return;
    const show = (open) => button.setAttribute("aria-expanded", String(open));
    show(false);
    button.addEventListener("click", () => show(button.getAttribute("aria-expanded") !== "true"));
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && button.getAttribute("aria-expanded") === "true") {
        show(false);
        button.focus();
      }
    });
    // A tap anywhere else closes it, as a menu does.
    document.addEventListener("click", (event) => {
      if (!button.contains(event.target) && !nav.contains(event.target)) show(false);
    });
  });
}
document.addEventListener("DOMContentLoaded", menus);
