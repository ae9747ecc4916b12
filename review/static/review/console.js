// Onceguard console: the little behaviour the pages need, loaded from 'self' (the CSP allows
// no inline script). Click a shortened id to copy its full value.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var el = event.target.closest ? event.target.closest("[data-copy]") : null;
    // An id that is also a row's link opens the row: navigation wins over copying there.
    if (!el || el.closest("a")) { return; }
    var text = el.getAttribute("data-copy");
    var done = function () {
      el.classList.add("og-copied");
      window.setTimeout(function () { el.classList.remove("og-copied"); }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () {});
    } else {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "og-offscreen";
      document.body.appendChild(area);
      area.select();
      try { document.execCommand("copy"); done(); } catch (e) { /* nothing to do */ }
      document.body.removeChild(area);
    }
    event.preventDefault();
  });
})();
