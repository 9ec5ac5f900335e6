"use strict";
// Entity pages (bert_tasks/insight/entity_pages.py): hover tips, the legend's type switches and, on the
// evaluation page, the filters by error kind and entity type.
(function () {
  const tip = document.getElementById("tip");
  document.addEventListener("mouseover", (event) => {
    const mark = event.target.closest("[data-tip]");
    if (!mark) {
      tip.hidden = true;
      return;
    }
    tip.textContent = mark.dataset.tip;
    const box = mark.getBoundingClientRect();
    tip.style.left = `${box.left}px`;
    tip.style.top = `${box.bottom + 4}px`;
    tip.hidden = false;
  });

  // Legend: a click hides (or shows again) the colour of every entity of that type.
  for (const chip of document.querySelectorAll(".legend-type")) {
    chip.addEventListener("click", () => {
      const on = chip.getAttribute("aria-pressed") !== "true";
      chip.setAttribute("aria-pressed", String(on));
      for (const mark of document.querySelectorAll("mark.entity")) {
        if (mark.dataset.type === chip.dataset.type) mark.classList.toggle("off", !on);
      }
    });
  }

  const kinds = document.getElementById("kind-filter");
  if (!kinds) return;
  const typeFilter = document.getElementById("type-filter");
  const sentences = [...document.querySelectorAll("section.sentence")];
  const listed = (el) => JSON.parse(el.dataset.types);
  let kind = "errors";

  // An error matches the kind chosen ("errors": any kind) and, when one is chosen, involves the type.
  function matches(item, type) {
    return (kind === "errors" || item.dataset.kind === kind) && (!type || listed(item).includes(type));
  }

  function filter() {
    const type = typeFilter.value;
    let shown = 0;
    for (const section of sentences) {
      const items = [...section.querySelectorAll(".errors li")];
      for (const item of items) item.classList.toggle("dimmed", kind !== "all" && !matches(item, type));
      const visible =
        kind === "all" ? !type || listed(section).includes(type) : items.some((item) => matches(item, type));
      section.hidden = !visible;
      if (visible) shown += 1;
    }
    for (const chip of kinds.querySelectorAll("button")) {
      chip.setAttribute("aria-pressed", String(chip.dataset.kind === kind));
    }
    document.getElementById("shown").textContent = `showing ${shown} of ${sentences.length} sentences`;
  }

  kinds.addEventListener("click", (event) => {
    const chip = event.target.closest("button[data-kind]");
    if (!chip) return;
    kind = chip.dataset.kind;
    filter();
  });
  typeFilter.addEventListener("change", filter);
  filter();
})();
