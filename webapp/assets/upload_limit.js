// Says so when a file is over the upload limit: the upload box drops such files silently.
(function () {
  "use strict";

  function mib(bytes) {
    return (bytes / 1048576).toFixed(1);
  }

  function show(message) {
    var toast = document.getElementById("upload-toast");
    if (!toast) {
      toast = document.createElement("div");
      toast.id = "upload-toast";
      toast.className = "error-banner toast";
      toast.setAttribute("role", "alert");
      toast.addEventListener("click", function () { toast.remove(); });
      document.body.appendChild(toast);
    }
    toast.textContent = "Error: " + message;
    clearTimeout(toast.hideTimer);
    toast.hideTimer = setTimeout(function () { toast.remove(); }, 10000);
  }

  function check(target, files) {
    var box = target && target.closest ? target.closest("[data-max-bytes]") : null;
    if (!box || !files) {
      return;
    }
    var max = Number(box.getAttribute("data-max-bytes"));
    for (var i = 0; i < files.length; i++) {
      if (max > 0 && files[i].size > max) {
        show(files[i].name + " is " + mib(files[i].size) + " MiB, over the " + mib(max) +
             " MiB upload limit; put it in the served folder instead.");
      }
    }
  }

  document.addEventListener("change", function (e) { check(e.target, e.target.files); }, true);
  document.addEventListener("drop", function (e) { check(e.target, e.dataTransfer && e.dataTransfer.files); }, true);
})();
