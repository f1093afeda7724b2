// Keyboard navigation on the timeline, as in Perfetto: W/S zoom in and out, A/D pan left
// and right; the arrow keys do the same. Keys typed into a field are left alone.
(function () {
  "use strict";

  var BUTTONS = {
    w: "timeline-zoom-in", arrowup: "timeline-zoom-in",
    s: "timeline-zoom-out", arrowdown: "timeline-zoom-out",
    a: "timeline-pan-left", arrowleft: "timeline-pan-left",
    d: "timeline-pan-right", arrowright: "timeline-pan-right"
  };

  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) {
      return;
    }
    var target = e.target;
    var tag = target && target.tagName ? target.tagName.toLowerCase() : "";
    if (tag === "input" || tag === "textarea" || tag === "select" || (target && target.isContentEditable)) {
      return;
    }
    var id = BUTTONS[(e.key || "").toLowerCase()];
    var button = id ? document.getElementById(id) : null;
    if (button) {
      e.preventDefault();
      button.click();
    }
  });
})();
