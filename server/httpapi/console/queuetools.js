// Warren's web console, part two: browsing a queue without taking its messages, redriving
// selected dead letters, and the stream and super stream pages. It uses app.js's helpers
// ($, api, esc, enc, table, setStatus, ensureLayout, views) and registers its views there.
"use strict";

// --- browse and redrive (the queue page) ---------------------------------------------------

// queueToolsHTML is the queue page's browse section; app.js puts it in the page's layout.
function queueToolsHTML(q) {
  const stream = q.type === "stream";
  return `<h2>Browse messages</h2>
    <p class="hint">A read-only peek: nothing is delivered, no delivery count or redelivered flag changes${stream ? "" : ", and the order stays"}.</p>
    <form id="q-browse" class="inline">
      <label>Count <input name="count" id="browse-count" value="20" size="4"></label>
      ${stream ? `<label>From offset <input name="offset" id="browse-offset" size="8" placeholder="first"></label>` : ""}
      <button id="browse-submit">Browse</button></form>
    <div id="browse-results"></div>`;
}

// deathOf is a message's x-death entries (newest first), or [] without a history.
function deathOf(m) {
  const h = (m.properties && m.properties.headers) || {};
  return Array.isArray(h["x-death"]) ? h["x-death"] : [];
}

function fmtDeath(d) {
  const keys = Array.isArray(d["routing-keys"]) ? d["routing-keys"].join(", ") : "";
  const time = d.time ? new Date(Number(d.time) * 1000).toISOString().replace(".000", "") : "";
  return `<span class="death">${esc(d.queue)} · ${esc(d.reason)} ×${esc(d.count)} · from ${esc(d.exchange || "(default)")}` +
    ` [${esc(keys)}]${time ? " · " + esc(time) : ""}</span>`;
}

// wireQueueTools attaches the browse and redrive handlers once the layout is in place.
function wireQueueTools(vhost, name, q) {
  const path = `/queues/${enc(vhost)}/${enc(name)}`;
  const stream = q.type === "stream";
  const browse = async () => {
    const body = { count: Number($("#browse-count").value) || 20, encoding: "auto", truncate: 2000 };
    const off = stream && $("#browse-offset").value.trim();
    if (off) body.offset = Number(off);
    const msgs = await api("POST", path + "/browse", body);
    const dead = msgs.some(m => deathOf(m).length);
    const rows = msgs.map(m => `<tr data-msg-id="${esc(m.id)}">
      ${stream ? "" : `<td><input type="checkbox" class="browse-select" value="${esc(m.id)}"${dead && deathOf(m).length ? "" : " disabled"}></td>`}
      <td class="num">${esc(m.id)}</td><td><pre class="payload">${esc(m.payload)}</pre></td>
      <td>${esc(m.exchange || "(default)")}</td><td>${esc(m.routing_key)}</td>
      ${stream ? "" : `<td class="redelivered">${m.redelivered}</td><td class="num">${esc(m.delivery_count)}</td>
      <td class="x-death">${deathOf(m).map(fmtDeath).join("<br>")}</td>`}</tr>`);
    const heads = stream ? ["Offset", "Payload", "Exchange", "Routing key"]
      : ["", "ID", "Payload", "Exchange", "Routing key", "Redelivered", "Deliveries", "x-death"];
    $("#browse-results").innerHTML = (msgs.length ? table(heads, rows) : "<p>No messages</p>") +
      (dead && !stream ? `<form id="q-redrive" class="inline">
        <label class="check"><input type="checkbox" id="redrive-source"> to the source queue only (not every queue the original keys route to)</label>
        <button id="redrive-submit">Redrive selected</button></form>` : "");
    const rf = $("#q-redrive");
    if (rf) rf.addEventListener("submit", async ev => {
      ev.preventDefault();
      const ids = [...document.querySelectorAll(".browse-select:checked")].map(c => Number(c.value));
      if (!ids.length) { setStatus("Select the messages to redrive"); return; }
      try {
        const r = await api("POST", path + "/redrive", { ids, to_source_queue: $("#redrive-source").checked });
        const why = r.results.filter(x => !x.moved).map(x => "message " + x.id + ": " + x.error).join("; ");
        setStatus(`Redrove ${r.moved} message${r.moved === 1 ? "" : "s"}` + (r.failed ? `, ${r.failed} failed: ${why}` : ""), !r.failed);
        await browse();
      } catch (e) { setStatus(e.message); }
    });
  };
  $("#q-browse").addEventListener("submit", async ev => {
    ev.preventDefault();
    try { await browse(); } catch (e) { setStatus(e.message); }
  });
}

// --- streams (on the queue page) -----------------------------------------------------------

function streamHTML() {
  return `<h2>Stream consumers</h2><div id="s-consumers" data-live></div>
    <h2>Consumer groups</h2><div id="s-groups" data-live></div>`;
}

function groupTables(groups) {
  if (!groups.length) return "<p>No consumer groups</p>";
  return groups.map(g => `<h3>Group ${esc(g.group)}</h3>
    <p>Members: ${g.members.length ? g.members.map(m => esc(m.consumer_tag + " @ " + m.node)).join(", ") : "none"}</p>` +
    table(["Partition", "Owner", "Committed offset", "Last offset", "Lag"],
      g.partitions.map(p => `<tr data-group="${esc(g.group)}" data-partition="${esc(p.partition)}"><td>${esc(p.partition)}</td>
        <td>${p.owner ? esc(p.owner.consumer_tag + " @ " + p.owner.node) : "none"}</td>
        <td class="num">${p.committed_offset === null ? "none" : esc(p.committed_offset)}</td>
        <td class="num">${p.last_offset === null ? "none" : esc(p.last_offset)}</td><td class="num lag">${esc(p.lag)}</td></tr>`))).join("");
}

// renderStreamParts fills a stream page's consumers and consumer groups; a partition of a super
// stream (bound from it with x-stream-partition-order) shows its super stream's groups on it.
async function renderStreamParts(vhost, name, bindings) {
  const parent = bindings.find(b => b.source && b.arguments && "x-stream-partition-order" in b.arguments);
  const [cons, all] = await Promise.all([api("GET", `/stream/consumers/${enc(vhost)}`),
    api("GET", `/stream/consumer-groups/${enc(vhost)}/${enc(parent ? parent.source : name)}`)]);
  const groups = parent ? all.map(g => ({ ...g, partitions: g.partitions.filter(p => p.partition === name) })) : all;
  $("#s-consumers").innerHTML = table(["Tag", "Name", "Next offset", "Lag", "Unacked", "Active"],
    cons.filter(c => c.queue.name === name).map(c => `<tr><td>${esc(c.consumer_tag)}</td><td>${esc(c.properties.name || "")}</td>
      <td class="num">${esc(c.offset)}</td><td class="num">${esc(c.offset_lag)}</td><td class="num">${esc(c.unacked)}</td><td>${c.active}</td></tr>`));
  $("#s-groups").innerHTML = (parent ? `<p>Partition of super stream <a href="#/superstream/${enc(vhost)}/${enc(parent.source)}">${esc(parent.source)}</a></p>` : "") +
    groupTables(groups);
}

// --- super streams -------------------------------------------------------------------------

async function renderSuperStreams() {
  const xs = await api("GET", "/exchanges");
  ensureLayout("superstreams", `<h1>Super streams</h1><div id="ss-list" data-live></div>`);
  const supers = xs.filter(x => x.type === "x-super-stream");
  $("#ss-list").innerHTML = supers.length ? table(["Vhost", "Name"], supers.map(x => `<tr data-super="${esc(x.name)}"><td>${esc(x.vhost)}</td>
    <td><a href="#/superstream/${enc(x.vhost)}/${enc(x.name)}">${esc(x.name)}</a></td></tr>`)) : "<p>No super streams</p>";
}

async function renderSuperStream(vhost, name) {
  const [bindings, groups] = await Promise.all([api("GET", `/exchanges/${enc(vhost)}/${enc(name)}/bindings/source`),
    api("GET", `/stream/consumer-groups/${enc(vhost)}/${enc(name)}`)]);
  const parts = await Promise.all(bindings.filter(b => b.destination_type === "queue")
    .map(b => api("GET", `/queues/${enc(vhost)}/${enc(b.destination)}`).then(q => ({ b, q }))));
  if (ensureLayout("superstream:" + vhost + "/" + name, `<h1>Super stream <span id="ss-name"></span></h1>
    <h2>Partitions</h2><div id="ss-parts" data-live></div><h2>Consumer groups</h2><div id="ss-groups" data-live></div>`)) {
    $("#ss-name").textContent = name + " (" + vhost + ")";
  }
  $("#ss-parts").innerHTML = table(["Partition", "Binding key", "Messages", "First offset", "Last offset", "Segments", "Consumers", "Publish/s"],
    parts.map(({ b, q }) => `<tr data-partition="${esc(q.name)}"><td><a href="#/queue/${enc(vhost)}/${enc(q.name)}">${esc(q.name)}</a></td>
      <td>${esc(b.routing_key)}</td><td class="num messages">${esc(q.messages)}</td><td class="num">${esc(q.first_offset)}</td>
      <td class="num">${esc(q.last_offset)}</td><td class="num">${esc(q.segments)}</td><td class="num">${esc(q.consumers)}</td>
      <td class="num">${rate(q.message_stats, "publish")}</td></tr>`));
  $("#ss-groups").innerHTML = groupTables(groups);
}

views.superstreams = renderSuperStreams;
views.superstream = renderSuperStream;
