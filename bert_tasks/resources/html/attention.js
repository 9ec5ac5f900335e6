"use strict";
// The attention page (bert_tasks/insight/attention_page.py writes its data): word pieces attending on the
// left, attended to on the right, a line per weight; a layers x heads overview to jump from.
(function () {
  const data = JSON.parse(document.getElementById("page-data").textContent);
  const tokens = data.tokens;
  const T = tokens.length;
  const L = data.layers;
  const H = data.heads;
  const ROW = 20; // pixels per word piece, as .token's height in attention.css
  const FAINT = 0.01; // with no word piece in focus, weights below this draw no line
  const SPECIAL = /^\[(CLS|SEP|PAD|UNK|MASK)\]$/;

  // [L, H, T, T] little-endian uint16 in 1 / scale units -> floats.
  function decode(b64) {
    const bytes = atob(b64);
    const out = new Float32Array(bytes.length / 2);
    for (let i = 0; i < out.length; i++) {
      out[i] = (bytes.charCodeAt(2 * i) | (bytes.charCodeAt(2 * i + 1) << 8)) / data.scale;
    }
    return out;
  }

  const views = data.models.map((m) => ({ name: m.name, w: decode(m.weights), diff: false }));
  if (views.length === 2) {
    const diff = new Float32Array(views[0].w.length);
    for (let i = 0; i < diff.length; i++) diff[i] = views[1].w[i] - views[0].w[i];
    views.push({ name: `${views[1].name} − ${views[0].name}`, w: diff, diff: true });
  }

  // focus: {side: "query" | "key", index} of the word piece under the pointer (or pinned by a click).
  const state = { view: 0, layer: data.layer, head: data.head, focus: null, pinned: false };
  const at = (w, l, h, q, k) => w[((l * H + h) * T + q) * T + k];
  const selectedHeads = () => (state.head === null ? [...Array(H).keys()] : [state.head]);
  const headHue = (h) => Math.round((360 * h) / H);
  const headColour = (h, alpha) => `hsla(${headHue(h)}, 75%, 42%, ${alpha})`;
  const signColour = (v, alpha) => (v >= 0 ? `rgba(217, 95, 2, ${alpha})` : `rgba(31, 100, 200, ${alpha})`);
  const $ = (id) => document.getElementById(id);

  function element(tag, className, text) {
    const el = document.createElement(tag);
    if (className) el.className = className;
    if (text !== undefined) el.textContent = text;
    return el;
  }

  // Largest |weight| of a layer's selected heads: the diff view scales its colours by it.
  function scaleOf(view, layer, heads) {
    if (!view.diff) return 1;
    let top = 1e-4;
    for (const h of heads) {
      const start = (layer * H + h) * T * T;
      for (let i = start; i < start + T * T; i++) top = Math.max(top, Math.abs(view.w[i]));
    }
    return top;
  }

  function pieceLabel(i) {
    const text = tokens[i];
    const piece = element("span", "piece");
    if (SPECIAL.test(text)) {
      piece.classList.add("special");
      piece.textContent = text;
      piece.title = `word piece ${i}: ${text}, a special token`;
    } else if (text.startsWith("##")) {
      piece.classList.add("continuation");
      piece.append(element("span", "hashes", "##"), text.slice(2));
      piece.title = `word piece ${i}: ${text}, continuing the word before it`;
    } else {
      piece.textContent = text;
      piece.title = `word piece ${i}: ${text}`;
    }
    return piece;
  }

  function buildColumn(side) {
    const column = $(side === "query" ? "queries" : "keys");
    const items = [];
    for (let i = 0; i < T; i++) {
      const el = element("div", "token");
      el.dataset.index = String(i);
      el.dataset.side = side;
      const parts = [element("span", "value"), element("span", "bars"), pieceLabel(i)];
      el.append(...(side === "query" ? parts : parts.reverse()));
      el.addEventListener("mouseenter", () => {
        if (!state.pinned) setFocus({ side, index: i });
      });
      el.addEventListener("mouseleave", () => {
        if (!state.pinned) setFocus(null);
      });
      el.addEventListener("click", () => {
        const same = state.focus && state.focus.side === side && state.focus.index === i;
        state.pinned = !(state.pinned && same);
        setFocus({ side, index: i });
      });
      column.append(el);
      items.push(el);
    }
    return items;
  }

  const columns = { query: buildColumn("query"), key: buildColumn("key") };
  const canvas = $("lines");
  canvas.height = T * ROW;
  canvas.style.height = `${T * ROW}px`;

  function setFocus(focus) {
    state.focus = focus;
    draw();
  }

  function fillControls() {
    const layer = $("layer");
    for (let l = 0; l < L; l++) layer.append(new Option(`${l}`, `${l}`));
    layer.addEventListener("change", () => {
      state.layer = Number(layer.value);
      draw();
    });
    const head = $("head");
    head.append(new Option("all heads", "all"));
    for (let h = 0; h < H; h++) head.append(new Option(`${h}`, `${h}`));
    head.addEventListener("change", () => {
      state.head = head.value === "all" ? null : Number(head.value);
      draw();
    });
    const chips = $("head-chips");
    for (let h = 0; h < H; h++) {
      const chip = element("button", "chip", `${h}`);
      chip.type = "button";
      chip.dataset.head = String(h);
      chip.title = `show head ${h} only`;
      chip.style.background = headColour(h, 1);
      chip.addEventListener("click", () => {
        state.head = h;
        draw();
      });
      chips.append(chip);
    }
    if (views.length > 1) {
      const box = $("views");
      views.forEach((view, i) => {
        const label = element("label");
        const radio = element("input");
        radio.type = "radio";
        radio.name = "view";
        radio.id = `view-${i}`;
        radio.value = String(i);
        radio.checked = i === state.view;
        radio.addEventListener("change", () => {
          state.view = i;
          buildOverview();
          draw();
        });
        label.append(radio, view.diff ? `difference (${view.name})` : view.name);
        box.append(label);
      });
    }
  }

  function focusText(view) {
    if (!state.focus) return "hover or click a word piece";
    const piece = `“${tokens[state.focus.index]}” (piece ${state.focus.index})`;
    const what = view.diff ? "change in attention" : "attention";
    return state.focus.side === "query" ? `${what} from ${piece} to every piece` : `${what} to ${piece} from every piece`;
  }

  // The weights of the focused piece's row (query) or column (key) on the other column's pieces.
  function showValues(view, heads, scale) {
    for (const side of ["query", "key"]) {
      for (const el of columns[side]) {
        el.classList.remove("focus", "pinned");
        el.style.background = "";
        delete el.dataset.weight;
        delete el.dataset.weights;
        el.querySelector(".value").textContent = "";
        el.querySelector(".bars").replaceChildren();
      }
    }
    if (!state.focus) return;
    const { side, index } = state.focus;
    columns[side][index].classList.add(state.pinned ? "pinned" : "focus");
    const other = side === "query" ? "key" : "query";
    columns[other].forEach((el, j) => {
      const [q, k] = side === "query" ? [index, j] : [j, index];
      const values = heads.map((h) => at(view.w, state.layer, h, q, k));
      if (heads.length === 1) {
        const v = values[0];
        el.dataset.weight = v.toFixed(4);
        el.querySelector(".value").textContent = v.toFixed(3);
        const alpha = Math.min(1, Math.abs(v) / scale) * 0.85;
        el.style.background = view.diff ? signColour(v, alpha) : headColour(heads[0], alpha);
      } else {
        el.dataset.weights = values.map((v) => v.toFixed(4)).join(",");
        const bars = el.querySelector(".bars");
        values.forEach((v, n) => {
          const bar = element("i");
          const alpha = Math.min(1, Math.abs(v) / scale);
          bar.style.background = view.diff ? signColour(v, alpha) : headColour(heads[n], alpha);
          bar.title = `head ${heads[n]}: ${v.toFixed(3)}`;
          bars.append(bar);
        });
      }
    });
  }

  function drawLines(view, heads, scale) {
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    const focus = state.focus;
    ctx.lineWidth = focus ? 2 : 1;
    for (const h of heads) {
      for (let q = 0; q < T; q++) {
        if (focus && focus.side === "query" && focus.index !== q) continue;
        for (let k = 0; k < T; k++) {
          if (focus && focus.side === "key" && focus.index !== k) continue;
          const v = at(view.w, state.layer, h, q, k);
          const strength = Math.min(1, Math.abs(v) / scale);
          if (strength < FAINT) continue;
          ctx.strokeStyle = view.diff ? signColour(v, strength) : headColour(h, strength);
          ctx.beginPath();
          ctx.moveTo(0, q * ROW + ROW / 2);
          ctx.lineTo(canvas.width, k * ROW + ROW / 2);
          ctx.stroke();
        }
      }
    }
  }

  // One small heatmap per layer and head: white (0) to dark (the largest weight), orange/blue by sign
  // for the difference, whose overview note names the head fine-tuning changed most.
  function buildOverview() {
    const view = views[state.view];
    const grid = $("overview");
    grid.replaceChildren();
    grid.style.gridTemplateColumns = `auto repeat(${H}, auto)`;
    grid.append(element("span", "col-label", ""));
    for (let h = 0; h < H; h++) grid.append(element("span", "col-label", `${h}`));
    let top = view.diff ? 1e-4 : 1; // weights on one 0-1 scale, as the PNG overview draws them
    if (view.diff) for (const v of view.w) top = Math.max(top, Math.abs(v));
    let most = { change: -1, layer: 0, head: 0 };
    for (let l = 0; l < L; l++) {
      grid.append(element("span", "row-label", `layer ${l}`));
      for (let h = 0; h < H; h++) {
        const thumb = element("canvas");
        thumb.width = T;
        thumb.height = T;
        thumb.dataset.layer = String(l);
        thumb.dataset.head = String(h);
        const image = thumb.getContext("2d").createImageData(T, T);
        let change = 0;
        for (let i = 0; i < T * T; i++) {
          const v = view.w[(l * H + h) * T * T + i];
          change += Math.abs(v);
          const s = Math.sqrt(Math.min(1, Math.abs(v) / top)); // sqrt: small weights stay visible
          const [r, g, b] = view.diff ? (v >= 0 ? [217, 95, 2] : [31, 100, 200]) : [8, 48, 107];
          image.data.set([255 - s * (255 - r), 255 - s * (255 - g), 255 - s * (255 - b), 255], 4 * i);
        }
        thumb.getContext("2d").putImageData(image, 0, 0);
        change /= T * T;
        if (change > most.change) most = { change, layer: l, head: h };
        thumb.title = `layer ${l}, head ${h}` + (view.diff ? `: mean |change| ${change.toFixed(4)}` : "");
        thumb.addEventListener("click", () => {
          state.layer = l;
          state.head = h;
          draw();
        });
        grid.append(thumb);
      }
    }
    $("overview-note").textContent = view.diff
      ? `Where attention changed (orange: more in ${views[1].name}, blue: less); the largest mean change is ` +
        `layer ${most.layer}, head ${most.head} (${most.change.toFixed(4)} per weight). Click a square to show it.`
      : "Each square is one head's attention (rows: word pieces attending, columns: attended to); " +
        "click one to show it.";
  }

  function draw() {
    const view = views[state.view];
    const heads = selectedHeads();
    const scale = scaleOf(view, state.layer, heads);
    $("layer").value = String(state.layer);
    $("head").value = state.head === null ? "all" : String(state.head);
    for (const chip of $("head-chips").children) {
      chip.setAttribute("aria-pressed", String(state.head === Number(chip.dataset.head)));
    }
    for (const thumb of $("overview").querySelectorAll("canvas")) {
      const inLayer = Number(thumb.dataset.layer) === state.layer;
      const current = inLayer && (state.head === null || Number(thumb.dataset.head) === state.head);
      thumb.classList.toggle("current", current && state.head !== null);
      thumb.classList.toggle("in-layer", current && state.head === null);
    }
    const which = state.head === null ? "all heads" : `head ${state.head}`;
    $("status").textContent = `${view.name} | layer ${state.layer} | ${which}: ${focusText(view)}`;
    showValues(view, heads, scale);
    drawLines(view, heads, scale);
  }

  fillControls();
  buildOverview();
  draw();
})();
