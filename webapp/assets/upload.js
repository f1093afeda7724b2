// Uploads a chosen trace: checks its size against the limit, sends the file itself (not
// base64 inside a callback) to the server, then opens the trace the server kept.
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

  function open(trace) {
    var params = new URLSearchParams(window.location.search);
    var kept = new URLSearchParams();
    if (params.get("other")) {
      kept.set("other", params.get("other"));
    }
    kept.set("trace", trace);
    window.location.search = "?" + kept.toString();
  }

  function send(box, file) {
    var max = Number(box.getAttribute("data-max-bytes"));
    if (max > 0 && file.size > max) {
      show(file.name + " is " + mib(file.size) + " MiB, over the " + mib(max) +
           " MiB upload limit; put it in the served folder instead.");
      return;
    }
    box.classList.add("uploading");
    fetch(box.getAttribute("data-upload-url"), {
      method: "POST",
      body: file,
      credentials: "same-origin",
      headers: {"X-Upload-Name": encodeURIComponent(file.name), "Content-Type": "application/octet-stream"}
    }).then(function (response) {
      return response.json().catch(function () { return {error: "the server answered " + response.status}; });
    }).then(function (answer) {
      box.classList.remove("uploading");
      if (answer.trace) {
        open(answer.trace);
      } else {
        show(answer.error || "the upload failed; try again");
      }
    }).catch(function () {
      box.classList.remove("uploading");
      show("the upload of " + file.name + " did not reach the server; try again");
    });
  }

  document.addEventListener("change", function (e) {
    var box = e.target && e.target.closest ? e.target.closest("[data-upload-url]") : null;
    if (!box || !e.target.files || !e.target.files.length) {
      return;
    }
    send(box, e.target.files[0]);
    e.target.value = "";  // choosing the same file again uploads it again
  }, true);

  document.addEventListener("dragover", function (e) {
    if (e.target && e.target.closest && e.target.closest("[data-upload-url]")) {
      e.preventDefault();
    }
  }, true);
  document.addEventListener("drop", function (e) {
    var box = e.target && e.target.closest ? e.target.closest("[data-upload-url]") : null;
    if (box && e.dataTransfer && e.dataTransfer.files.length) {
      e.preventDefault();
      send(box, e.dataTransfer.files[0]);
    }
  }, true);
})();
