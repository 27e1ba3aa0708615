// Shared helpers of the console's pages: the nav, JSON requests, small DOM builders.
"use strict";
const PI = (() => {
  const pages = [["/", "Collections"], ["/search", "Search"], ["/compare", "Compare"],
                 ["/evaluate", "Evaluate"]];
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  function nav() {
    const here = location.pathname === "/collections" ? "/" : location.pathname;
    document.body.prepend(el("nav", {}, el("span", {class: "brand"}, "polyindex"),
      pages.map(([href, label]) => el("a", {href, class: href === here ? "here" : null}, label))));
  }
  async function api(path, params) {
    const qs = params ? "?" + new URLSearchParams(params).toString() : "";
    const r = await fetch(path + qs, {credentials: "same-origin"});
    const body = await r.json().catch(() => ({error: r.statusText}));
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }
  function params() { return new URLSearchParams(location.search); }
  function fail(where, e) {
    where.replaceChildren(el("div", {class: "error", id: "error"}, String(e.message || e)));
  }
  function fmt(x, digits = 4) {
    return x === null || x === undefined ? "–" : typeof x === "number" ? x.toFixed(digits) : String(x);
  }
  function bytes(n) {
    if (!n) return "0 B";
    const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
    while (n >= 1000 && i < u.length - 1) { n /= 1000; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
  }
  // a form's fields as the page's link (GET), so every view is a URL
  function fill(form, p) {
    for (const input of form.querySelectorAll("input[name],select[name]")) {
      if (p.has(input.name) && input.type !== "checkbox") input.value = p.get(input.name);
    }
  }
  async function collections(select, chosen) {
    const o = await api("/api/overview");
    select.replaceChildren(...o.collections.map(c => el("option", {value: c.name,
      selected: c.name === chosen}, c.name)));
    return o.collections;
  }
  return {el, nav, api, params, fail, fmt, bytes, fill, collections};
})();
