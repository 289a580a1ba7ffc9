// Warren's web console: a single page on the management API (/api), no build step.
// Credentials are kept in sessionStorage and sent as HTTP Basic on every request.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const view = () => $("#view");
let refreshTimer = null;
const rateHistory = { publish: [], deliver_get: [], ack: [] };

function creds() { return sessionStorage.getItem("warren-auth"); }

async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Basic " + creds(), "X-Requested-With": "XMLHttpRequest" } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch("/api" + path, opts);
  if (resp.status === 401 && path === "/whoami") throw new Error("Login failed");
  const text = await resp.text();
  let data = null;
  if (text) { try { data = JSON.parse(text); } catch (e) { data = text; } }
  if (!resp.ok) throw new Error((data && data.reason) || resp.statusText);
  return data;
}

function esc(s) {
  return String(s === undefined || s === null ? "" : s)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
const enc = encodeURIComponent;
function rate(ms, k) { const d = ms && ms[k + "_details"]; return d ? d.rate.toFixed(1) : "0.0"; }
function fmtBytes(n) {
  if (n === undefined) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}
function setStatus(msg, ok) { const s = $("#status"); s.textContent = msg || ""; s.className = ok ? "ok" : "error"; }
function table(headers, rows) {
  return "<table><thead><tr>" + headers.map(h => "<th>" + esc(h) + "</th>").join("") +
    "</tr></thead><tbody>" + rows.join("") + "</tbody></table>";
}
function formData(form) { return Object.fromEntries(new FormData(form).entries()); }

// --- login ---------------------------------------------------------------------------------

async function login(user, pass) {
  sessionStorage.setItem("warren-auth", btoa(unescape(enc(user + ":" + pass))));
  try {
    const me = await api("GET", "/whoami");
    $("#who").textContent = me.name + (me.tags.length ? " (" + me.tags.join(", ") + ")" : "");
    showApp(true);
    route();
  } catch (e) {
    sessionStorage.removeItem("warren-auth");
    $("#login-error").textContent = e.message;
    showApp(false);
  }
}

function showApp(on) {
  $("#login").hidden = on;
  $("#nav").hidden = !on;
  $("#logout").hidden = !on;
  view().hidden = !on;
  if (!on) { $("#who").textContent = ""; clearInterval(refreshTimer); }
}

$("#login-form").addEventListener("submit", ev => {
  ev.preventDefault();
  $("#login-error").textContent = "";
  login($("#login-user").value, $("#login-pass").value);
});
$("#logout").addEventListener("click", () => { sessionStorage.removeItem("warren-auth"); showApp(false); });

// --- routing -------------------------------------------------------------------------------

const views = {
  overview: renderOverview, queues: renderQueues, queue: renderQueue, exchanges: renderExchanges,
  connections: renderConnections, admin: renderAdmin, policies: renderPolicies, definitions: renderDefinitions,
};

function route() {
  if (!creds()) { showApp(false); return; }
  const parts = (location.hash.replace(/^#\//, "") || "overview").split("/").map(decodeURIComponent);
  const name = views[parts[0]] ? parts[0] : "overview";
  document.querySelectorAll("#nav a").forEach(a => a.classList.toggle("active", a.dataset.view === name ||
    (name === "queue" && a.dataset.view === "queues") || (name === "superstream" && a.dataset.view === "superstreams")));
  clearInterval(refreshTimer);
  setStatus("");
  const render = () => views[name](...parts.slice(1)).catch(e => setStatus(e.message));
  render();
  refreshTimer = setInterval(() => { if (!document.activeElement || !document.activeElement.closest("form")) render(); }, 5000);
}
window.addEventListener("hashchange", route);

// Renders keep forms the user is typing in: only the parts marked data-live are replaced.
function ensureLayout(key, html) {
  if (view().dataset.layout !== key) { view().innerHTML = html; view().dataset.layout = key; return true; }
  return false;
}

// --- overview ------------------------------------------------------------------------------

async function renderOverview() {
  const [ov, nodes, health] = await Promise.all([api("GET", "/overview"), api("GET", "/nodes"),
    api("GET", "/health/checks/alarms").catch(e => ({ status: "failed", reason: e.message }))]);
  const fresh = ensureLayout("overview", `<h1>Overview</h1><div id="ov-cards" class="cards"></div>
    <h2>Message rates (per second)</h2><canvas id="rates" width="720" height="180"></canvas>
    <div id="ov-rates"></div><h2>Nodes (cluster members)</h2><div id="ov-nodes"></div><h2>Listeners</h2><div id="ov-listeners"></div>`);
  const t = ov.object_totals, q = ov.queue_totals, ms = ov.message_stats || {};
  $("#ov-cards").innerHTML = [["Connections", t.connections], ["Channels", t.channels], ["Queues", t.queues],
    ["Exchanges", t.exchanges], ["Consumers", t.consumers], ["Messages", q.messages], ["Ready", q.messages_ready],
    ["Unacked", q.messages_unacknowledged], ["Cluster members", nodes.filter(n => n.running).length + " of " + nodes.length + " running"],
    ["Alarms", health.status === "ok" ? "none" : (health.reason || "raised")]].map(([k, v]) => `<div class="card" data-total="${esc(k.toLowerCase())}">${esc(k)}<b>${esc(v)}</b></div>`).join("");
  for (const k of Object.keys(rateHistory)) {
    rateHistory[k].push(Number(rate(ms, k)));
    if (rateHistory[k].length > 60) rateHistory[k].shift();
  }
  if (fresh) for (const k of Object.keys(rateHistory)) rateHistory[k] = rateHistory[k].slice(-1);
  drawRates($("#rates"));
  $("#ov-rates").innerHTML = table(["publish", "deliver/get", "ack", "confirm", "returned", "dropped"],
    ["<tr>" + ["publish", "deliver_get", "ack", "confirm", "return_unroutable", "drop_unroutable"]
      .map(k => `<td class="num">${rate(ms, k)}</td>`).join("") + "</tr>"]);
  $("#ov-nodes").innerHTML = table(["Name", "Running", "Memory", "Memory limit", "Disk free", "Disk limit", "Alarms", "Uptime"],
    nodes.map(n => `<tr><td>${esc(n.name)}</td><td>${n.running ? "yes" : "no"}</td><td class="num">${fmtBytes(n.mem_used)}</td>
      <td class="num">${n.mem_limit ? fmtBytes(n.mem_limit) : "none"}</td><td class="num">${fmtBytes(n.disk_free)}</td>
      <td class="num">${fmtBytes(n.disk_free_limit)}</td><td>${[n.mem_alarm && "memory", n.disk_free_alarm && "disk"].filter(Boolean).join(", ") || "none"}</td>
      <td class="num">${n.uptime !== undefined ? Math.round(n.uptime / 1000) + " s" : ""}</td></tr>`));
  $("#ov-listeners").innerHTML = table(["Protocol", "Address", "Port"],
    (ov.listeners || []).map(l => `<tr><td>${esc(l.protocol)}</td><td>${esc(l.ip_address)}</td><td class="num">${esc(l.port)}</td></tr>`));
}

// drawRates plots the rates sampled at each refresh (the last 60, 5 minutes): a line per rate, a
// dot per sample, the scale on the left. The canvas's data-points says how many samples it shows.
function drawRates(c) {
  const g = c.getContext("2d"), w = c.width, h = c.height, left = 50, top0 = 20, bottom = h - 20;
  g.clearRect(0, 0, w, h);
  const all = [].concat(...Object.values(rateHistory));
  const top = Math.max(1, ...all);
  const y = v => bottom - (v / top) * (bottom - top0);
  const x = i => left + (i / 59) * (w - left - 10);
  g.strokeStyle = "#e0e0e0"; g.fillStyle = "#555"; g.lineWidth = 1;
  for (const v of [0, top / 2, top]) {
    g.beginPath(); g.moveTo(left, y(v)); g.lineTo(w - 10, y(v)); g.stroke();
    g.fillText(v.toFixed(v < 10 ? 1 : 0) + "/s", 5, y(v) + 4);
  }
  g.fillText("5 min ago", left, h - 5); g.fillText("now", w - 30, h - 5);
  const colours = { publish: "#1565c0", deliver_get: "#2e7d32", ack: "#ef6c00" };
  let legend = left;
  for (const [k, pts] of Object.entries(rateHistory)) {
    const off = 60 - pts.length; // the newest sample is at the right edge
    g.strokeStyle = colours[k]; g.fillStyle = colours[k]; g.lineWidth = 2; g.beginPath();
    pts.forEach((v, i) => { i ? g.lineTo(x(off + i), y(v)) : g.moveTo(x(off + i), y(v)); });
    g.stroke();
    pts.forEach((v, i) => { g.beginPath(); g.arc(x(off + i), y(v), 2.5, 0, 2 * Math.PI); g.fill(); });
    g.fillText(k + " " + (pts.length ? pts[pts.length - 1].toFixed(1) : "0.0"), legend, 12); legend += 120;
  }
  c.dataset.points = String(Math.max(...Object.values(rateHistory).map(p => p.length)));
}

// --- queues --------------------------------------------------------------------------------

async function renderQueues() {
  const [queues, vhosts] = await Promise.all([api("GET", "/queues"), api("GET", "/vhosts")]);
  if (ensureLayout("queues", `<h1>Queues and streams</h1><div id="q-list" data-live></div>
    <h2>Declare a queue</h2><form id="q-declare" class="inline">
      <label>Vhost <select name="vhost" id="q-declare-vhost"></select></label>
      <label>Name <input name="name" required></label>
      <label>Type <select name="type"><option>classic</option><option>quorum</option><option>stream</option></select></label>
      <label>Durable <select name="durable"><option>true</option><option>false</option></select></label>
      <label>Arguments (JSON) <input name="arguments" value="{}"></label>
      <button>Declare</button></form>`)) {
    $("#q-declare").addEventListener("submit", async ev => {
      ev.preventDefault();
      const f = formData(ev.target);
      try {
        const args = JSON.parse(f.arguments || "{}");
        args["x-queue-type"] = f.type;
        await api("PUT", `/queues/${enc(f.vhost)}/${enc(f.name)}`, { durable: f.durable === "true", arguments: args });
        setStatus("Queue " + f.name + " declared", true);
        ev.target.reset();
        renderQueues();
      } catch (e) { setStatus(e.message); }
    });
  }
  const sel = $("#q-declare-vhost");
  if (!sel.options.length) sel.innerHTML = vhosts.map(v => `<option>${esc(v.name)}</option>`).join("");
  $("#q-list").innerHTML = table(["Vhost", "Name", "Type", "Messages", "Ready", "Unacked", "Consumers", "Publish/s", "Deliver/get/s", "Ack/s", "Stream offsets"],
    queues.map(q => `<tr data-queue="${esc(q.name)}" data-vhost="${esc(q.vhost)}"><td>${esc(q.vhost)}</td>
      <td><a href="#/queue/${enc(q.vhost)}/${enc(q.name)}">${esc(q.name)}</a></td><td>${esc(q.type)}</td>
      <td class="num messages">${esc(q.messages)}</td><td class="num">${esc(q.messages_ready)}</td><td class="num">${esc(q.messages_unacknowledged)}</td>
      <td class="num">${esc(q.consumers)}</td><td class="num">${rate(q.message_stats, "publish")}</td>
      <td class="num">${rate(q.message_stats, "deliver_get")}</td><td class="num">${rate(q.message_stats, "ack")}</td>
      <td>${q.type === "stream" ? esc(q.first_offset + "–" + q.last_offset + " (" + q.segments + " segments)") : ""}</td></tr>`));
}

async function renderQueue(vhost, name) {
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const [q, bindings, consumers] = await Promise.all([api("GET", path), api("GET", path + "/bindings"), api("GET", `/consumers/${enc(vhost)}`)]);
  if (ensureLayout("queue:" + vhost + "/" + name, `<h1>Queue <span id="q-name"></span></h1><div id="q-cards" class="cards" data-live></div>
    <h2>Bindings</h2><div id="q-bindings"></div><h2>Consumers</h2><div id="q-consumer-list"></div>
    <h2>Publish a message</h2><form id="q-publish" class="inline">
      <label>Routing key <input name="routing_key" id="publish-key"></label>
      <label>Payload <input name="payload" id="publish-payload" size="40"></label>
      <label>Persistent <select name="persistent"><option>false</option><option>true</option></select></label>
      <button id="publish-submit">Publish</button></form>
    <div${q.type === "stream" ? " hidden" : ""}><h2>Get messages</h2><form id="q-get" class="inline">
      <label>Count <input name="count" id="get-count" value="1" size="4"></label>
      <label>Ack mode <select name="ackmode" id="get-ackmode"><option value="ack_requeue_true">Nack, requeue</option>
        <option value="ack_requeue_false">Ack (remove)</option><option value="reject_requeue_false">Reject (dead-letter)</option></select></label>
      <button id="get-submit">Get</button></form><div id="get-results"></div></div>
    ${queueToolsHTML(q)}${q.type === "stream" ? streamHTML() : ""}
    <h2>Danger zone</h2><button id="q-purge" class="danger"${q.type === "stream" ? " hidden" : ""}>Purge</button> <button id="q-delete" class="danger">Delete</button>`)) {
    wireQueueTools(vhost, name, q);
    $("#q-name").textContent = name + " (" + vhost + ")";
    $("#publish-key").value = name;
    $("#q-publish").addEventListener("submit", async ev => {
      ev.preventDefault();
      const f = formData(ev.target);
      try {
        const r = await api("POST", `/exchanges/${enc(vhost)}/amq.default/publish`, { routing_key: f.routing_key, payload: f.payload,
          payload_encoding: "string", properties: f.persistent === "true" ? { delivery_mode: 2 } : {} });
        setStatus(r.routed ? "Message published" : "Message published but not routed", r.routed);
        renderQueue(vhost, name);
      } catch (e) { setStatus(e.message); }
    });
    $("#q-get").addEventListener("submit", async ev => {
      ev.preventDefault();
      const f = formData(ev.target);
      try {
        const msgs = await api("POST", path + "/get", { count: Number(f.count), ackmode: f.ackmode, encoding: "auto", truncate: 50000 });
        $("#get-results").innerHTML = msgs.length ? msgs.map((m, i) => `<div class="message"><h3>Message ${i + 1}</h3>
          <p>Exchange: ${esc(m.exchange || "(default)")}, routing key: ${esc(m.routing_key)}, redelivered: ${m.redelivered}, ${m.message_count} left</p>
          <p>Properties: ${esc(JSON.stringify(m.properties))}</p><pre class="payload">${esc(m.payload)}</pre></div>`).join("")
          : "<p>Queue is empty</p>";
        renderQueue(vhost, name);
      } catch (e) { setStatus(e.message); }
    });
    $("#q-purge").addEventListener("click", async () => {
      if (!confirm("Purge " + name + "?")) return;
      try { await api("DELETE", path + "/contents"); setStatus("Queue purged", true); renderQueue(vhost, name); } catch (e) { setStatus(e.message); }
    });
    $("#q-delete").addEventListener("click", async () => {
      if (!confirm("Delete " + name + "?")) return;
      try { await api("DELETE", path); location.hash = "#/queues"; } catch (e) { setStatus(e.message); }
    });
  }
  const ms = q.message_stats || {};
  const cards = [["Type", q.type], ["Messages", q.messages], ["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged],
    ["Consumers", q.consumers], ["Publish/s", rate(ms, "publish")], ["Deliver/get/s", rate(ms, "deliver_get")], ["Ack/s", rate(ms, "ack")],
    ["Published", ms.publish || 0], ["Policy", q.policy || "none"]];
  if (q.type === "stream") {
    cards.push(["First offset", q.first_offset], ["Last offset", q.last_offset], ["Segments", q.segments], ["Bytes", fmtBytes(q.message_bytes)]);
    await renderStreamParts(vhost, name, bindings);
  }
  $("#q-cards").innerHTML = cards.map(([k, v]) => `<div class="card" id="q-${esc(k.toLowerCase().replace(/[^a-z]/g, ""))}">${esc(k)}<b>${esc(v)}</b></div>`).join("");
  $("#q-bindings").innerHTML = table(["From", "Routing key", "Arguments"],
    bindings.map(b => `<tr><td>${esc(b.source || "(default)")}</td><td>${esc(b.routing_key)}</td><td>${esc(JSON.stringify(b.arguments))}</td></tr>`));
  $("#q-consumer-list").innerHTML = table(["Tag", "Channel", "Ack required", "Prefetch"],
    consumers.filter(c => c.queue.name === name).map(c => `<tr><td>${esc(c.consumer_tag)}</td><td>${esc(c.channel_details.name)}</td>
      <td>${c.ack_required}</td><td class="num">${esc(c.prefetch_count)}</td></tr>`));
}

// --- exchanges -----------------------------------------------------------------------------

async function renderExchanges() {
  const [xs, bindings, vhosts] = await Promise.all([api("GET", "/exchanges"), api("GET", "/bindings"), api("GET", "/vhosts")]);
  if (ensureLayout("exchanges", `<h1>Exchanges</h1><div id="x-list"></div><h2>Bindings</h2><div id="x-bindings"></div>
    <h2>Declare an exchange</h2><form id="x-declare" class="inline">
      <label>Vhost <select name="vhost" id="x-vhost"></select></label><label>Name <input name="name" required></label>
      <label>Type <select name="type"><option>direct</option><option>fanout</option><option>topic</option><option>headers</option></select></label>
      <label>Durable <select name="durable"><option>true</option><option>false</option></select></label><button>Declare</button></form>
    <h2>Bind</h2><form id="x-bind" class="inline">
      <label>Vhost <select name="vhost" id="b-vhost"></select></label><label>Source exchange <input name="source" required></label>
      <label>Destination <select name="dtype"><option value="q">queue</option><option value="e">exchange</option></select></label>
      <label>Destination name <input name="destination" required></label><label>Routing key <input name="routing_key"></label><button>Bind</button></form>`)) {
    $("#x-declare").addEventListener("submit", async ev => {
      ev.preventDefault(); const f = formData(ev.target);
      try { await api("PUT", `/exchanges/${enc(f.vhost)}/${enc(f.name)}`, { type: f.type, durable: f.durable === "true" }); setStatus("Exchange declared", true); renderExchanges(); }
      catch (e) { setStatus(e.message); }
    });
    $("#x-bind").addEventListener("submit", async ev => {
      ev.preventDefault(); const f = formData(ev.target);
      try { await api("POST", `/bindings/${enc(f.vhost)}/e/${enc(f.source)}/${f.dtype}/${enc(f.destination)}`, { routing_key: f.routing_key, arguments: {} }); setStatus("Binding added", true); renderExchanges(); }
      catch (e) { setStatus(e.message); }
    });
  }
  for (const id of ["#x-vhost", "#b-vhost"]) if (!$(id).options.length) $(id).innerHTML = vhosts.map(v => `<option>${esc(v.name)}</option>`).join("");
  $("#x-list").innerHTML = table(["Vhost", "Name", "Type", "Durable", "Auto-delete", "Internal", ""],
    xs.map(x => `<tr><td>${esc(x.vhost)}</td><td>${x.type === "x-super-stream" ? `<a href="#/superstream/${enc(x.vhost)}/${enc(x.name)}">${esc(x.name)}</a>` : esc(x.name || "(default)")}</td><td>${esc(x.type)}</td><td>${x.durable}</td><td>${x.auto_delete}</td>
      <td>${x.internal}</td><td>${x.name && !x.name.startsWith("amq.") ? `<button class="danger" data-del-x="${esc(x.name)}" data-vhost="${esc(x.vhost)}">Delete</button>` : ""}</td></tr>`));
  view().querySelectorAll("[data-del-x]").forEach(b => b.onclick = async () => {
    try { await api("DELETE", `/exchanges/${enc(b.dataset.vhost)}/${enc(b.dataset.delX)}`); renderExchanges(); } catch (e) { setStatus(e.message); }
  });
  $("#x-bindings").innerHTML = table(["Vhost", "Source", "Destination", "Type", "Routing key", ""],
    bindings.filter(b => b.source).map(b => `<tr><td>${esc(b.vhost)}</td><td>${esc(b.source)}</td><td>${esc(b.destination)}</td><td>${esc(b.destination_type)}</td>
      <td>${esc(b.routing_key)}</td><td><button class="danger" data-unbind="/bindings/${enc(b.vhost)}/e/${enc(b.source)}/${b.destination_type[0]}/${enc(b.destination)}/${enc(b.properties_key)}">Unbind</button></td></tr>`));
  view().querySelectorAll("[data-unbind]").forEach(b => b.onclick = async () => {
    try { await api("DELETE", b.dataset.unbind); renderExchanges(); } catch (e) { setStatus(e.message); }
  });
}

// --- connections ---------------------------------------------------------------------------

async function renderConnections() {
  const [conns, chans] = await Promise.all([api("GET", "/connections"), api("GET", "/channels")]);
  ensureLayout("connections", `<h1>Connections</h1><div id="c-list"></div><h2>Channels</h2><div id="ch-list"></div>`);
  $("#c-list").innerHTML = table(["Name", "User", "Vhost", "Protocol", "Client", "Channels", ""],
    conns.map(c => `<tr data-conn="${esc(c.name)}"><td>${esc(c.name)}</td><td>${esc(c.user)}</td><td>${esc(c.vhost)}</td><td>${esc(c.protocol)}</td>
      <td>${esc((c.client_properties || {}).product || "")}</td><td class="num">${esc(c.channels)}</td>
      <td><button class="danger" data-close="${esc(c.name)}">Close</button></td></tr>`));
  view().querySelectorAll("[data-close]").forEach(b => b.onclick = async () => {
    try { await fetch("/api/connections/" + enc(b.dataset.close), { method: "DELETE", headers: { Authorization: "Basic " + creds(), "X-Requested-With": "XMLHttpRequest", "X-Reason": "Closed from the Warren console" } }); renderConnections(); }
    catch (e) { setStatus(e.message); }
  });
  $("#ch-list").innerHTML = table(["Channel", "User", "Mode", "Prefetch", "Unacked", "Consumers", "Publish/s", "Deliver/get/s", "Ack/s"],
    chans.map(c => `<tr><td>${esc(c.name)}</td><td>${esc(c.user)}</td><td>${c.confirm ? "confirm" : c.transactional ? "tx" : ""}</td>
      <td class="num">${esc(c.prefetch_count)}</td><td class="num">${esc(c.messages_unacknowledged)}</td><td class="num">${esc(c.consumer_count)}</td>
      <td class="num">${rate(c.message_stats, "publish")}</td><td class="num">${rate(c.message_stats, "deliver_get")}</td><td class="num">${rate(c.message_stats, "ack")}</td></tr>`));
}

// --- users, vhosts, permissions ------------------------------------------------------------

async function renderAdmin() {
  const [users, vhosts, perms] = await Promise.all([api("GET", "/users"), api("GET", "/vhosts"), api("GET", "/permissions")]);
  if (ensureLayout("admin", `<h1>Users</h1><div id="u-list"></div><form id="u-add" class="inline">
      <label>Name <input name="name" required></label><label>Password <input name="password" type="password"></label>
      <label>Tags <input name="tags" placeholder="administrator, monitoring"></label><button>Add user</button></form>
    <h1>Virtual hosts</h1><div id="v-list"></div><form id="v-add" class="inline"><label>Name <input name="name" required></label>
      <label>Description <input name="description"></label><button>Add vhost</button></form>
    <h1>Permissions</h1><div id="p-list"></div><form id="p-set" class="inline">
      <label>User <input name="user" required></label><label>Vhost <input name="vhost" value="/" required></label>
      <label>Configure <input name="configure" value=".*"></label><label>Write <input name="write" value=".*"></label>
      <label>Read <input name="read" value=".*"></label><button>Set permission</button></form>`)) {
    $("#u-add").addEventListener("submit", async ev => {
      ev.preventDefault(); const f = formData(ev.target);
      try { await api("PUT", "/users/" + enc(f.name), { password: f.password, tags: f.tags }); setStatus("User " + f.name + " saved", true); ev.target.reset(); renderAdmin(); }
      catch (e) { setStatus(e.message); }
    });
    $("#v-add").addEventListener("submit", async ev => {
      ev.preventDefault(); const f = formData(ev.target);
      try { await api("PUT", "/vhosts/" + enc(f.name), { description: f.description }); setStatus("Vhost " + f.name + " added", true); ev.target.reset(); renderAdmin(); }
      catch (e) { setStatus(e.message); }
    });
    $("#p-set").addEventListener("submit", async ev => {
      ev.preventDefault(); const f = formData(ev.target);
      try { await api("PUT", `/permissions/${enc(f.vhost)}/${enc(f.user)}`, { configure: f.configure, write: f.write, read: f.read }); setStatus("Permission set", true); renderAdmin(); }
      catch (e) { setStatus(e.message); }
    });
  }
  const del = (attr, path, what) => view().querySelectorAll(`[${attr}]`).forEach(b => b.onclick = async () => {
    if (!confirm("Delete " + what + " " + b.getAttribute(attr) + "?")) return;
    try { await api("DELETE", path(b)); renderAdmin(); } catch (e) { setStatus(e.message); }
  });
  $("#u-list").innerHTML = table(["Name", "Tags", ""], users.map(u => `<tr><td>${esc(u.name)}</td><td>${esc(u.tags.join(", "))}</td>
    <td><button class="danger" data-del-user="${esc(u.name)}">Delete</button></td></tr>`));
  $("#v-list").innerHTML = table(["Name", "Description", "Messages", ""], vhosts.map(v => `<tr><td>${esc(v.name)}</td><td>${esc(v.description)}</td>
    <td class="num">${esc(v.messages)}</td><td><button class="danger" data-del-vhost="${esc(v.name)}">Delete</button></td></tr>`));
  $("#p-list").innerHTML = table(["User", "Vhost", "Configure", "Write", "Read", ""], perms.map(p => `<tr><td>${esc(p.user)}</td><td>${esc(p.vhost)}</td>
    <td>${esc(p.configure)}</td><td>${esc(p.write)}</td><td>${esc(p.read)}</td>
    <td><button class="danger" data-del-perm="${esc(p.user)}" data-vhost="${esc(p.vhost)}">Clear</button></td></tr>`));
  del("data-del-user", b => "/users/" + enc(b.dataset.delUser), "user");
  del("data-del-vhost", b => "/vhosts/" + enc(b.dataset.delVhost), "vhost");
  del("data-del-perm", b => `/permissions/${enc(b.dataset.vhost)}/${enc(b.dataset.delPerm)}`, "the permission of");
}

// --- policies ------------------------------------------------------------------------------

async function renderPolicies() {
  const [pols, opols] = await Promise.all([api("GET", "/policies"), api("GET", "/operator-policies")]);
  if (ensureLayout("policies", `<h1>Policies</h1><div id="pol-list"></div><form id="pol-add" class="inline">
      <label>Vhost <input name="vhost" value="/"></label><label>Name <input name="name" required></label>
      <label>Pattern <input name="pattern" required></label>
      <label>Apply to <select name="apply"><option>queues</option><option>exchanges</option><option>all</option><option>classic_queues</option><option>quorum_queues</option><option>streams</option></select></label>
      <label>Definition (JSON) <input name="definition" value='{"max-length": 1000}' size="30"></label>
      <label>Priority <input name="priority" value="0" size="3"></label><button>Save policy</button></form>
    <h1>Operator policies</h1><div id="opol-list"></div>`)) {
    $("#pol-add").addEventListener("submit", async ev => {
      ev.preventDefault(); const f = formData(ev.target);
      try {
        await api("PUT", `/policies/${enc(f.vhost)}/${enc(f.name)}`, { pattern: f.pattern, "apply-to": f.apply, definition: JSON.parse(f.definition), priority: Number(f.priority) });
        setStatus("Policy saved", true); renderPolicies();
      } catch (e) { setStatus(e.message); }
    });
  }
  const rows = list => list.map(p => `<tr><td>${esc(p.vhost)}</td><td>${esc(p.name)}</td><td>${esc(p.pattern)}</td><td>${esc(p["apply-to"])}</td>
    <td>${esc(JSON.stringify(p.definition))}</td><td class="num">${esc(p.priority)}</td>
    <td><button class="danger" data-del-pol="${esc(p.name)}" data-vhost="${esc(p.vhost)}">Delete</button></td></tr>`);
  const heads = ["Vhost", "Name", "Pattern", "Apply to", "Definition", "Priority", ""];
  $("#pol-list").innerHTML = table(heads, rows(pols));
  $("#opol-list").innerHTML = table(heads, rows(opols));
  $("#pol-list").querySelectorAll("[data-del-pol]").forEach(b => b.onclick = async () => {
    try { await api("DELETE", `/policies/${enc(b.dataset.vhost)}/${enc(b.dataset.delPol)}`); renderPolicies(); } catch (e) { setStatus(e.message); }
  });
  $("#opol-list").querySelectorAll("[data-del-pol]").forEach(b => b.onclick = async () => {
    try { await api("DELETE", `/operator-policies/${enc(b.dataset.vhost)}/${enc(b.dataset.delPol)}`); renderPolicies(); } catch (e) { setStatus(e.message); }
  });
}

// --- definitions ---------------------------------------------------------------------------

async function renderDefinitions() {
  if (!ensureLayout("definitions", `<h1>Definitions</h1><p><button id="d-export">Export</button></p><pre id="d-out"></pre>
    <h2>Import</h2><form id="d-import"><textarea name="defs" rows="10" cols="80" placeholder="definitions JSON"></textarea><br><button>Import</button></form>`)) return;
  $("#d-export").onclick = async () => {
    try { $("#d-out").textContent = JSON.stringify(await api("GET", "/definitions"), null, 2); } catch (e) { setStatus(e.message); }
  };
  $("#d-import").addEventListener("submit", async ev => {
    ev.preventDefault();
    try { await api("POST", "/definitions", JSON.parse(formData(ev.target).defs)); setStatus("Definitions imported", true); } catch (e) { setStatus(e.message); }
  });
}

// --- start ---------------------------------------------------------------------------------

if (creds()) {
  api("GET", "/whoami").then(me => { $("#who").textContent = me.name; showApp(true); route(); }).catch(() => showApp(false));
} else {
  showApp(false);
}
