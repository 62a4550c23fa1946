// Keyboard shortcuts of the review pages: a accepts, n goes to the next document,
// e edits the first field, / searches. Keys typed into a field are left alone.
"use strict";
document.addEventListener("keydown", function (event) {
  if (event.ctrlKey || event.metaKey || event.altKey) {
    return;
  }
  var target = event.target;
  var tag = target && target.tagName ? target.tagName.toLowerCase() : "";
  if (tag === "input" || tag === "textarea" || tag === "select" || (target && target.isContentEditable)) {
    return;
  }
  if (event.key === "a") {
    var accept = document.getElementById("accept-form");
    if (accept) {
      event.preventDefault();
      accept.requestSubmit();
    }
  } else if (event.key === "n") {
    var next = document.getElementById("next-link");
    if (next) {
      event.preventDefault();
      window.location.assign(next.href);
    }
  } else if (event.key === "e") {
    var field = document.querySelector("#correct-form input, #correct-form select");
    if (field) {
      event.preventDefault();
      field.focus();
    }
  } else if (event.key === "/") {
    var search = document.getElementById("search");
    if (search) {
      event.preventDefault();
      search.focus();
    }
  }
});
// Forms marked data-confirm ask once more before they post.
document.addEventListener("submit", function (event) {
  var form = event.target;
  var question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});
