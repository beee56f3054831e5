// The job page's live progress (docs/console.md "Job"): poll the job's JSON every second and
// write each field into the element marked data-field="NAME". No build chain, no library.
(function () {
  "use strict";
  var page = document.querySelector("[data-poll]");
  if (!page) { return; }
  var source = page.getAttribute("data-poll");
  var finals = { SUCCEEDED: true, FAILED: true, ABANDONED: true };
  function show(data) {
    Object.keys(data.fields).forEach(function (name) {
      var el = page.querySelector('[data-field="' + name + '"]');
      if (el) { el.textContent = data.fields[name]; }
    });
    var bar = page.querySelector("progress");
    if (bar && data.roots_total) { bar.max = data.roots_total; bar.value = data.roots; }
    var stamp = document.getElementById("updated");
    if (stamp) { stamp.textContent = data.now; }
    return !finals[data.state];
  }
  function poll() {
    fetch(source, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (data === null || show(data)) { window.setTimeout(poll, 1000); }
      })
      .catch(function () { window.setTimeout(poll, 3000); });
  }
  window.setTimeout(poll, 1000);
}());
