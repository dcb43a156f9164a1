// Click a column header to sort its rows (numbers by value with their unit, text alphabetically; again to reverse).
(function(){
var U={ns:1e-9,'\u00b5s':1e-6,us:1e-6,ms:1e-3,s:1,B:1,KiB:1024,MiB:1048576,GiB:1073741824,k:1e3};
function key(t){var m=t.replace(/,/g,'').match(/-?\d+(?:\.\d+)?(?:e[-+]?\d+)?/i);
if(!m)return[1,t.toLowerCase()];var v=parseFloat(m[0]);
var u=t.slice(m.index+m[0].length).match(/^\s*(ns|\u00b5s|us|ms|s|B|KiB|MiB|GiB|k)\b/);
if(u)v*=U[u[1]];return[0,v];}
function cmp(a,b){if(a[0]!==b[0])return a[0]-b[0];return a[1]<b[1]?-1:a[1]>b[1]?1:0;}
document.querySelectorAll('table.board-table').forEach(function(tb){
tb.querySelectorAll('thead th').forEach(function(th,i){
var b=th.querySelector('button');if(!b)return;
b.addEventListener('click',function(){
var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
tb.querySelectorAll('thead th').forEach(function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',dir>0?'ascending':'descending');
var body=tb.tBodies[0],rows=Array.prototype.slice.call(body.rows);
rows.sort(function(x,y){return dir*cmp(key(x.cells[i].textContent),key(y.cells[i].textContent));});
rows.forEach(function(r){body.appendChild(r);});});});});
})();
